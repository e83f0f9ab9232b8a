"""Screening retrieved text for planted prompt injections: a static rule set with stable rule ids (Guard.scan).

A chunk indexed from a document someone else wrote can carry instructions
aimed at the model that reads it ("ignore the previous instructions and
..."), a fake system header, a markdown image whose URL smuggles the
conversation out, a command for the agent to run, or text hidden from the
human reader (zero-width or tag characters, HTML comments, CSS-hidden
elements, base64/hex/URL-encoded/rot13 blobs).  ``Guard.scan(text)``
returns a ``Finding`` per match: a stable ``rule_id`` (RULE_IDS is the
closed set, for metrics labels; an operator pattern's is
``deny_pattern.<index>``, and ``Guard.rule_ids`` adds those), its
``category`` (CATEGORIES), a ``confidence`` in 0..1 and the span in
``text`` (for decoded text, the span of the hidden or encoded source).
Callers keep the findings at or above a threshold (DEFAULT_MIN_CONFIDENCE,
chosen by bench/guard.py on a labelled set and on ordinary documentation).

Precision matters as much as recall: documentation quotes attacks, code says
``ignore_errors=True``, a guide says "ignore the previous section if you use
X".  So a match's confidence moves with its context: inside a code span or
fence, in quotes, after explanatory framing ("for example", "an attack such
as") or followed by a condition ("... if you use Docker") it drops; addressed
to an AI, assistant or model, or hidden, it rises.

Hidden and encoded text is decoded (a bounded amount) and scanned once more
with the plain rules, never recursively.  Every quantifier in the patterns
is bounded and candidates are pre-filtered by plain substring tests, so a
scan stays linear on pathological input (1 MB of near-matches); a rule
reports at most _MAX_PER_RULE findings per text.  Operator ``deny_patterns``
are the operator's own regexes: their cost is theirs.

May import: nothing.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import codecs
import logging
import re
import unicodedata
import urllib.parse
from dataclasses import dataclass

CATEGORIES = ("instruction_override", "role_hijack", "exfiltration", "tool_coercion", "hidden_text",
              "encoded_payload", "deny_pattern")
# Chosen by bench/guard.py: the labelled set's precision and recall and the
# false positives on SciFact, CoSQA and CPython's docs (bench/RESULTS.md).
DEFAULT_MIN_CONFIDENCE = 0.5

# Decoding budgets: a scan decodes at most this many characters of hidden or
# encoded text in all, from at most this many blobs, each cut to a maximum.
_DECODE_BUDGET = 65536
_MAX_BLOBS = 64
_MAX_BLOB = 8192


@dataclass(frozen=True)
class Finding:
    rule_id: str
    category: str
    confidence: float
    start: int
    end: int


def _c(words):
    return "|".join(words)


_I = re.IGNORECASE

# Instruction override, per language: a verb of dismissal, then (within the
# clause) the noun for instructions, or the noun first (German infinitives,
# Japanese).  A qualifier (previous, above, all, system, your) in the match
# makes it strong; without one it stays weak.
_OVERRIDE_LANGS = {
    "en": (
        [r"ignore", r"ignoring", r"disregard", r"disregarding", r"forget", r"override", r"bypass", r"skip",
         r"dismiss", r"discard", r"abandon", r"drop", r"do\s{1,3}not\s{1,3}(?:follow|obey)",
         r"don'?t\s{1,3}(?:follow|obey)", r"stop\s{1,3}following", r"no\s{1,3}longer\s{1,3}(?:follow|obey)",
         r"pay\s{1,3}no\s{1,3}attention\s{1,3}to", r"throw\s{1,3}out", r"set\s{1,3}aside"],
        [r"instructions?", r"prompts?", r"directions", r"directives?", r"rules", r"guidelines", r"guidance",
         r"commands", r"orders", r"constraints", r"restrictions", r"programming", r"guardrails", r"safeguards",
         r"policies", r"system\s{1,3}(?:prompt|message)", r"context", r"messages"],
        [r"previous", r"previously", r"prior", r"preceding", r"above", r"earlier", r"former", r"foregoing",
         r"all", r"any", r"every", r"your", r"system", r"original", r"initial", r"developer", r"existing",
         r"other", r"before", r"whatever", r"so\s{1,3}far", r"until\s{1,3}now", r"you\s{1,3}(?:were\s{1,3})?(?:got|given|received)"],
    ),
    "de": (
        [r"ignorier\w{0,3}", r"vergiss", r"vergessen", r"vergesst", r"missachte\w{0,2}", r"übergeh\w{0,2}",
         r"verwirf", r"verwerfen", r"befolge\s{1,3}nicht", r"nicht\s{1,3}(?:mehr\s{1,3})?befolgen",
         r"außer\s{1,3}acht\s{1,3}lassen"],
        [r"anweisung\w{0,2}", r"instruktion\w{0,2}", r"anordnung\w{0,2}", r"befehl\w{0,2}", r"regeln",
         r"vorgaben", r"richtlinien", r"systemanweisung\w{0,2}", r"systemprompt\w{0,2}", r"prompts?"],
        [r"vorherig\w{0,2}", r"vorig\w{0,2}", r"bisherig\w{0,2}", r"obig\w{0,2}", r"alle\w?", r"früher\w{0,2}",
         r"vorangegangen\w{0,2}", r"deine\w?", r"ursprünglich\w{0,2}", r"system\w{0,8}"],
    ),
    "fr": (
        [r"ignor\w{0,4}", r"oubli\w{0,4}", r"ne\s{1,3}(?:tiens|tenez|tenir)\s{1,3}pas\s{1,3}compte",
         r"fai(?:s|tes)\s{1,3}abstraction", r"ne\s{1,3}(?:suis|suivez)\s{1,3}plus", r"abandonne\w{0,2}"],
        [r"instructions?", r"consignes?", r"directives?", r"règles", r"ordres", r"commandes", r"prompts?"],
        [r"précédent\w{0,2}", r"antérieur\w{0,2}", r"ci-dessus", r"toutes", r"tous", r"tes", r"vos",
         r"système", r"initial\w{0,2}", r"d'origine", r"originales?"],
    ),
    "es": (
        [r"ignor\w{0,4}", r"olvid\w{0,4}", r"haz\s{1,3}caso\s{1,3}omiso", r"hagan?\s{1,3}caso\s{1,3}omiso",
         r"descart\w{0,3}", r"omit\w{0,3}", r"no\s{1,3}sigas", r"deja\s{1,3}de\s{1,3}seguir", r"pasa\s{1,3}por\s{1,3}alto"],
        [r"instrucciones", r"instrucción", r"indicaciones", r"órdenes", r"reglas", r"directrices", r"directivas",
         r"comandos"],
        [r"anteriores", r"previas", r"precedentes", r"todas", r"todos", r"tus", r"sus", r"del\s{1,3}sistema",
         r"originales", r"iniciales"],
    ),
    "it": (
        [r"ignor\w{0,4}", r"dimentic\w{0,4}", r"trascur\w{0,3}", r"non\s{1,3}considerare", r"non\s{1,3}seguire",
         r"tralascia\w{0,2}", r"scarta\w{0,2}"],
        [r"istruzion\w", r"indicazion\w", r"direttive", r"regole", r"comandi", r"ordini", r"prompt"],
        [r"precedent\w", r"tutte", r"tutti", r"tue", r"sopra", r"del\s{1,3}sistema", r"original\w", r"iniziali"],
    ),
    "pt": (
        [r"ignor\w{0,4}", r"esqueç\w{0,3}", r"esquec\w{0,3}", r"desconsider\w{0,3}", r"descart\w{0,3}",
         r"não\s{1,3}siga", r"deixe\s{1,3}de\s{1,3}seguir"],
        [r"instruções", r"instrucoes", r"instrução", r"orientações", r"diretrizes", r"regras", r"comandos",
         r"ordens"],
        [r"anteriores", r"prévias", r"previas", r"todas", r"todos", r"suas", r"tuas", r"do\s{1,3}sistema",
         r"originais", r"iniciais", r"acima"],
    ),
    "nl": (
        [r"negeer", r"negeren", r"vergeet", r"vergeten", r"veronachtzaam", r"volg\s{1,3}niet", r"niet\s{1,3}(?:meer\s{1,3})?volgen"],
        [r"instructies", r"instructie", r"aanwijzingen", r"opdrachten", r"regels", r"richtlijnen", r"prompts?",
         r"systeeminstructies"],
        [r"vorige", r"eerdere", r"voorgaande", r"bovenstaande", r"alle", r"je", r"jouw", r"uw", r"oorspronkelijke",
         r"systeem\w{0,10}"],
    ),
    "ru": (
        [r"игнорир\w{0,4}", r"проигнорир\w{0,4}", r"забудь\w{0,2}", r"забыть", r"не\s{1,3}обращай\w{0,2}\s{1,3}внимания",
         r"отбрось\w{0,2}", r"не\s{1,3}следуй\w{0,2}", r"не\s{1,3}выполняй\w{0,2}"],
        [r"инструкци\w{0,2}", r"указани\w{0,2}", r"команд\w{0,2}", r"правил\w{0,2}", r"промпт\w{0,2}",
         r"распоряжени\w{0,2}"],
        [r"предыдущ\w{0,3}", r"прежн\w{0,3}", r"вышеуказанн\w{0,3}", r"все", r"всех", r"твои", r"ваши",
         r"системн\w{0,3}", r"исходн\w{0,3}", r"выше"],
    ),
    "zh": (
        [r"忽略", r"忽视", r"無視", r"无视", r"忘记", r"忘掉", r"忘記", r"不要理会", r"不要理會", r"不要遵守",
         r"不再遵守", r"丢弃", r"放弃", r"跳过"],
        [r"指令", r"指示", r"提示词?", r"说明", r"說明", r"规则", r"規則", r"命令", r"要求", r"设定", r"設定"],
        [r"之前", r"以上", r"上面", r"先前", r"所有", r"前面", r"上述", r"一切", r"系统", r"系統", r"原来", r"原有"],
    ),
    "ja": (
        [r"無視", r"忘れ", r"従わな", r"破棄", r"捨て"],
        [r"指示", r"命令", r"指令", r"プロンプト", r"ルール", r"設定", r"制約"],
        [r"以前", r"前の", r"これまで", r"上記", r"すべて", r"全て", r"先ほど", r"システム", r"元の"],
    ),
}
_CJK = {"zh", "ja"}
_VERB_LAST = {"de", "nl", "ja", "zh", "ru"}
# Nouns weaker than "instructions": "forget all the rules you learned for chess" is prose
_WEAK_NOUN = re.compile(r"\b(?:rules|guidelines|guidance|context|messages|orders|commands|policies|regeln|règles|reglas"
                        r"|regole|regras|regels|правил\w{0,2}|команд\w{0,2})\b|规则|規則|命令|ルール", _I)


def _lang_patterns():
    rules = []
    for lang, (verbs, nouns, quals) in _OVERRIDE_LANGS.items():
        b = "" if lang in _CJK else r"\b"
        verb = re.compile(r"%s(?:%s)%s" % (b, _c(verbs), b), _I)
        noun = re.compile(r"%s(?:%s)%s" % (b, _c(nouns), b), _I)
        qual = re.compile(r"%s(?:%s)%s" % (b, _c(quals), b), _I)
        rules.append((lang, verb, noun, qual))
    return rules


# A verb and a noun pair up within this many characters of one clause; the noun
# comes first only in German and Dutch infinitives, Japanese and Chinese objects.
_PAIR_GAP = 60
_PAIR_GAP_CJK = 24
_PAIR_GAP_BACK = 40
_CLAUSE_BREAK = re.compile(r"[.!?;\n\u3002\uff01\uff1f]")
_CLAUSE_BREAK_BACK = re.compile(r"[.!?;,\"\u201c\u201d\u00ab\u00bb\u3001\u3002\uff0c\uff01\uff1f\n]")
_MAX_PER_RULE = 50


def _pairs(text, verb, noun, lang):
    """(start, end, backward) of each verb ... noun phrase (or noun ... verb), found by pairing the two
    lists: linear in the text, where one regex with a gap between them would rescan every gap."""
    verbs = [(m.start(), m.end()) for m in verb.finditer(text)]
    if not verbs:
        return
    nouns = [(m.start(), m.end()) for m in noun.finditer(text)]
    if not nouns:
        return
    noun_starts = [n[0] for n in nouns]
    gap = _PAIR_GAP_CJK if lang in _CJK else _PAIR_GAP
    for vs, ve in verbs:
        i = bisect.bisect_left(noun_starts, ve)
        if i < len(nouns) and nouns[i][0] - ve <= gap and not _CLAUSE_BREAK.search(text, ve, nouns[i][0]):
            yield vs, nouns[i][1], False
    if lang in _VERB_LAST:
        verb_starts = [v[0] for v in verbs]
        for ns, ne in nouns:
            i = bisect.bisect_left(verb_starts, ne)
            if i < len(verbs) and verbs[i][0] - ne <= _PAIR_GAP_BACK and not _CLAUSE_BREAK_BACK.search(text, ne, verbs[i][0]):
                yield ns, verbs[i][1], True


_LANG_RULES = _lang_patterns()

# Plain-substring gates: a language's patterns run only if one of its verb
# stems occurs at all (the common case for ordinary text: none does).
_LANG_GATES = {
    "en": ("ignor", "disregard", "forget", "overrid", "bypass", "skip", "dismiss", "discard", "abandon",
           "drop", "follow", "obey", "attention", "throw", "aside"),
    "de": ("ignorier", "vergiss", "vergess", "missacht", "übergeh", "verwirf", "verwerf", "befolge", "acht"),
    "fr": ("ignor", "oubli", "compte", "abstraction", "suis", "suivez", "abandonn"),
    "es": ("ignor", "olvid", "omiso", "descart", "omit", "sigas", "seguir", "alto"),
    "it": ("ignor", "dimentic", "trascur", "considerare", "seguire", "tralasci", "scart"),
    "pt": ("ignor", "esqueç", "esquec", "desconsider", "descart", "siga", "seguir"),
    "nl": ("negeer", "negeren", "vergeet", "vergeten", "veronachtza", "volg"),
    "ru": ("игнорир", "забуд", "забыт", "внимани", "отброс", "следуй", "выполняй"),
    "zh": ("忽略", "忽视", "無視", "无视", "忘记", "忘掉", "忘記", "不要", "不再", "丢弃", "放弃", "跳过"),
    "ja": ("無視", "忘れ", "従わ", "破棄", "捨て"),
}

# (rule_id, category, base confidence, compiled pattern, substring gate)
_SIMPLE = [
    ("override.new_instructions", "instruction_override", 0.55,
     r"\b(?:new|updated|revised|real|actual|true|secret|hidden|override)\s{1,3}(?:system\s{1,3})?instructions?\s{0,2}:", "instruction"),
    ("override.from_now_on", "instruction_override", 0.7,
     r"\bfrom\s{1,3}now\s{1,3}on\b,?\s{1,3}(?:you|the\s{1,3}(?:assistant|ai|model))\b(?:\s{1,3}[\w']{1,15}){0,3}?"
     r"\s{1,3}(?:respond|reply|answer|act|behave|pretend|role-?play|obey|ignore|speak|talk|output|say|refuse"
     r"|are\s{1,3}(?:no\s{1,3}longer|now|free|dan\b|an?\s{1,3}(?:unrestricted|unfiltered|different|new|evil))"
     r"|will\s{1,3}(?:only|always|never))", "now on"),
    ("override.supersede", "instruction_override", 0.7,
     r"\b(?:these|this|the\s{1,3}following|my|new)\s{1,3}(?:instructions?|rules|directives?)\s{1,3}"
     r"(?:take\s{1,3}(?:precedence|priority)|supersede|override|replace|overrule)\s{1,3}(?:over\s{1,3})?"
     r"(?:all|any|every|your|the)\b", "instruction"),
    ("override.forget_everything", "instruction_override", 0.45,
     r"\bforget\s{1,3}(?:everything|all)\s{1,3}(?:you\s{1,3}(?:were|have\s{1,3}been)\s{1,3}told|above|before"
     r"|that\s{1,3}came\s{1,3}before|(?:you|i)\s{1,3}(?:said|told\s{1,3}you)(?:\s{1,3}(?:before|earlier))?)", "forget"),
    ("override.multilingual_from_now_on", "instruction_override", 0.6,
     r"(?:\bab\s{1,3}(?:jetzt|sofort)\s{1,3}(?:bist|antwortest|ignorierst|befolgst)\s{1,3}du\b"
     r"|\bà\s{1,3}partir\s{1,3}de\s{1,3}maintenant,?\s{1,3}tu\s{1,3}(?:es|dois|réponds|ignores)\b"
     r"|\ba\s{1,3}partir\s{1,3}de\s{1,3}ahora,?\s{1,3}(?:eres|debes|responde|responderás|ignora)\b"
     r"|\bd'ora\s{1,3}in\s{1,3}poi,?\s{1,3}(?:sei|devi|rispondi|risponderai|ignora)\b"
     r"|\ba\s{1,3}partir\s{1,3}de\s{1,3}agora,?\s{1,3}(?:você|voce)\s{1,3}(?:é|deve|responderá|vai)\b"
     r"|\bvanaf\s{1,3}nu\s{1,3}(?:ben|antwoord|moet|negeer)\s{1,3}je\b"
     r"|\bотныне\s{1,3}ты\b|\bс\s{1,3}этого\s{1,3}момента\s{1,3}ты\b"
     r"|从现在开始[，,]?你|從現在開始[，,]?你|今後[、,]?あなたは|これからあなたは)",
     "ab jetzt|ab sofort|partir de|d'ora|vanaf nu|отныне|с этого|从现在|從現在|今後|これから"),

    ("role.chat_template_token", "role_hijack", 0.8,
     r"<\|im_start\|>\s{0,3}(?:system|assistant)|<\|(?:system|start_header_id)\|>\s{0,3}(?:system)?"
     r"|<\|im_end\|>", "<|"),
    ("role.inst_markers", "role_hijack", 0.7, r"<<SYS>>|<</SYS>>|\[/?INST\](?=[^\n]{0,80}?\b(?:you|ignore|disregard|forget|reveal|tell|act)\b)",
     "<<sys>>|<</sys>>|inst]"),
    ("role.fake_system_header", "role_hijack", 0.75,
     r"(?:^|\n|(?<=[.!?] ))[ \t>*#]{0,8}[\[(]?(?:system|system\s{1,3}(?:prompt|message|note|override)|developer(?:\s{1,3}message)?"
     r"|admin(?:istrator)?\s{1,3}(?:message|override)|sys)[\])]?\s{0,3}[:：\]]?\s{0,3}\n?[ \t]{0,4}"
     r"(?:you\s{1,3}(?:are|must|will|shall|should)\b|ignore\b|disregard\b|forget\b|from\s{1,3}now\b"
     r"|new\s{1,3}instructions|the\s{1,3}(?:assistant|ai|model)\s{1,3}(?:must|will|should)\b"
     r"|assistant\s{1,3}(?:must|will|should)\b|always\s{1,3}(?:respond|answer|reply)\b|do\s{1,3}not\s{1,3}(?:tell|reveal|mention)\b)",
     "sys|developer|admin"),
    ("role.you_are_now", "role_hijack", 0.8,
     r"\byou\s{1,3}are\s{1,3}(?:now\s{1,3}(?:dan\b|an?\s{1,3}(?:unrestricted|unfiltered|uncensored|jailbroken|evil|rogue"
     r"|different\s{1,3}(?:ai|assistant|model)|new\s{1,3}(?:ai|assistant|model))\b"
     r"|in\s{1,3}(?:developer|god|dan|jailbreak|unrestricted|debug|admin)\s{1,3}mode|free\s{1,3}(?:from|of)\s{1,3}(?:all|any|your)"
     r"|(?:called|named)\s{1,3}\w|my\s{1,3}(?:assistant|servant|agent)\b)"
     r"|no\s{1,3}longer\s{1,3}(?:an?\s{1,3})?(?:ai|assistant|claude|chatgpt|bound\s{1,3}by|restricted|limited\s{1,3}by)\b)", "you are"),
    ("role.dan", "role_hijack", 0.85, r"\bdo\s{1,3}anything\s{1,3}now\b|\bdeveloper\s{1,3}mode\s{1,3}(?:enabled|activated)\b"
     r"|\bjailbreak\s{1,3}mode\b|\bgod\s{1,3}mode\s{1,3}(?:enabled|activated)\b", "anything now|mode"),
    ("role.act_as_unrestricted", "role_hijack", 0.7,
     r"\b(?:act|behave|respond|pretend|roleplay)\s{1,3}(?:as|like|to\s{1,3}be)\s{1,3}(?:an?\s{1,3})?"
     r"(?:unrestricted|unfiltered|uncensored|jailbroken|evil|amoral|rogue)\b"
     r"|\bwithout\s{1,3}(?:any\s{1,3})?(?:restrictions|filters|censorship|ethical\s{1,3}guidelines|safety\s{1,3}guidelines)\b"
     r"(?=[^.\n]{0,40}\b(?:respond|answer|reply|act)\b)", "act|behave|respond|pretend|roleplay|without"),
    ("role.reveal_system_prompt", "role_hijack", 0.5,
     r"\b(?:reveal|print|show|output|repeat|display|leak|disclose|tell\s{1,3}me|give\s{1,3}me|share|dump|write\s{1,3}out"
     r"|echo|recite|paste|summari[sz]e)\s{1,3}(?:me\s{1,3})?(?:back\s{1,3})?(?:[\w-]{1,15}\s{1,3}){0,3}?"
     r"(?:system\s{1,3}prompt|initial\s{1,3}(?:prompt|instructions)|hidden\s{1,3}(?:prompt|instructions)"
     r"|original\s{1,3}instructions|developer\s{1,3}(?:message|prompt)|instructions\s{1,3}above|everything\s{1,3}above"
     r"|pre-?prompt|confidential\s{1,3}instructions)", "prompt|instructions|above"),
    ("role.multilingual_hijack", "role_hijack", 0.65,
     r"(?:\bdu\s{1,3}bist\s{1,3}(?:jetzt|nun|ab\s{1,3}sofort)\s{1,3}(?:ein\w{0,2}\s{1,3})?(?:dan|uneingeschränkt\w{0,2}|unzensiert\w{0,2}|frei)\b"
     r"|\btu\s{1,3}es\s{1,3}(?:maintenant|désormais)\s{1,3}(?:dan|un\s{1,3}(?:assistant\s{1,3})?(?:sans\s{1,3}restrictions?|non\s{1,3}censuré|libre))"
     r"|\bahora\s{1,3}eres\s{1,3}(?:dan|un\s{1,3}(?:asistente\s{1,3})?(?:sin\s{1,3}restricciones|sin\s{1,3}censura|libre))"
     r"|\bora\s{1,3}sei\s{1,3}(?:dan|un\s{1,3}(?:assistente\s{1,3})?(?:senza\s{1,3}restrizioni|senza\s{1,3}censura|libero))"
     r"|\bagora\s{1,3}(?:você|voce)\s{1,3}é\s{1,3}(?:dan|um\s{1,3}(?:assistente\s{1,3})?(?:sem\s{1,3}restrições|sem\s{1,3}censura|livre))"
     r"|\bje\s{1,3}bent\s{1,3}nu\s{1,3}(?:dan|een\s{1,3}(?:assistent\s{1,3})?(?:zonder\s{1,3}beperkingen|ongecensureerd\w?))"
     r"|\bтеперь\s{1,3}ты\s{1,3}(?:dan|свободн\w{0,2}|без\s{1,3}ограничений)"
     r"|你现在是\s{0,2}(?:dan|一个不受限制|没有任何限制)|你現在是\s{0,2}(?:dan|一個不受限制)|あなたは今(?:から)?\s{0,2}(?:dan|制限のない)"
     r"|(?:zeige|verrate|gib)\s{1,3}(?:mir\s{1,3})?(?:deinen|den)\s{1,3}system-?prompt"
     r"|(?:révèle|affiche|montre)[\w\s-]{0,20}(?:ton|le|votre)\s{1,3}prompt\s{1,3}système"
     r"|(?:revela|muestra|muéstrame)\s{1,3}(?:tu|el)\s{1,3}prompt\s{1,3}del\s{1,3}sistema"
     r"|(?:rivela|mostra|mostrami)\s{1,3}(?:il\s{1,3}tuo|il)\s{1,3}prompt\s{1,3}di\s{1,3}sistema"
     r"|(?:revele|mostre|me\s{1,3}mostre)\s{1,3}(?:seu|o)\s{1,3}prompt\s{1,3}do\s{1,3}sistema"
     r"|покажи\s{1,3}(?:свой\s{1,3}|мне\s{1,3})?системн\w{0,3}\s{1,3}(?:промпт|подсказк\w)"
     r"|(?:显示|泄露|告诉我|输出)你的系统提示|システムプロンプトを(?:表示|教えて|出力))",
     "du bist|tu es|eres|sei|você|voce|je bent|теперь|你现在|你現在|あなたは|system-prompt|systemprompt|prompt système"
     "|prompt del sistema|prompt di sistema|prompt do sistema|системн|系统提示|システムプロンプト"),

    ("exfil.send_data_to_url", "exfiltration", 0.75,
     r"\b(?:send|post|upload|transmit|forward|submit|exfiltrate|leak|report|email|append|attach|include|encode|embed|put)"
     r"\b(?:[^.\n]|\.(?=\S)){0,80}?\b(?:api[\s_-]{0,2}keys?|secrets?|passwords?|credentials|tokens?|conversation|chat\s{1,3}history"
     r"|user'?s?\s{1,3}(?:data|messages?|questions?|details|files|email)|environment\s{1,3}variables|system\s{1,3}prompt"
     r"|\.env\b|ssh\s{1,3}keys?|private\s{1,3}keys?|session\s{1,3}cookies?|previous\s{1,3}messages|memory)"
     r"\b(?:[^.\n]|\.(?=\S)){0,80}?(?:\bto\b|\bat\b|\binto\b|\bin\b|\bvia\b)(?:[^.\n]|\.(?=\S)){0,40}?(?:https?://|www\.|\burl\b|\bendpoint\b|\bwebhook\b)",
     "http|www.|url|endpoint|webhook"),
    ("exfil.fill_url", "exfiltration", 0.75,
     r"\b(?:replace|substitute|fill\s{1,3}in|append|add|include|put)\b(?:[^.\n]|\.(?=\S)){0,60}?"
     r"(?:\{[\w .-]{1,40}\}|\[[A-Z_]{3,30}\]|<[A-Z_]{3,30}>|\$[A-Z_]{3,30})(?:[^.\n]|\.(?=\S)){0,60}?\b(?:with|by)\b[^.\n]{0,60}?"
     r"\b(?:the\s{1,3})?(?:user'?s?|conversation|chat|secret|password|api\s{0,2}key|token|summary|previous|email|credentials|data)",
     "{|[|<|$"),

    ("tool.call_tool", "tool_coercion", 0.4,
     r"\b(?:call|invoke|use|run|execute|trigger)\s{1,3}(?:the\s{1,3})?(?:(?:tool|function)\s{1,3}[`'\"]?[\w.:-]{1,60}[`'\"]?"
     r"|[`'\"]?[\w.:-]{1,60}[`'\"]?\s{1,3}(?:tool|function))\s{1,3}(?:with|passing|using|on)\b", "tool|function"),
    ("tool.pipe_to_shell", "tool_coercion", 0.3,
     r"\b(?:curl|wget|iwr|invoke-webrequest)\b[^\n|]{0,300}\|\s{0,3}(?:sudo\s{1,3})?(?:ba|z|da|k)?sh\b"
     r"|\b(?:curl|wget|iwr|invoke-webrequest)\b[^\n|]{0,300}\|\s{0,3}(?:python3?|perl|iex|invoke-expression)\b", "curl|wget|iwr|invoke-webrequest"),
    ("tool.execute_command", "tool_coercion", 0.4,
     r"\b(?:execute|run)\s{1,3}(?:the\s{1,3}following|this|these)\s{1,3}(?:shell\s{1,3}|bash\s{1,3}|terminal\s{1,3}|powershell\s{1,3})?"
     r"(?:commands?|scripts?|code|snippet)\b", "execute|run"),
    ("tool.destructive_command", "tool_coercion", 0.35,
     r"\brm\s{1,3}-(?:rf|fr|r\s{1,3}-f)\s{1,3}(?:/|~|\$HOME|\*)|\bgit\s{1,3}push\s{1,3}(?:--force|-f)\b"
     r"|\bchmod\s{1,3}(?:-R\s{1,3})?777\s{1,3}/|\bmkfs\.|\bdd\s{1,3}if=\S{1,40}\s{1,3}of=/dev/", "rm|git|chmod|mkfs|dd"),
]
_SIMPLE = [(rid, cat, conf, re.compile(pat, _I | re.M), tuple(gate.split("|")) if gate else ())
           for rid, cat, conf, pat, gate in _SIMPLE]

_MD_URL = re.compile(r"(!?)\[([^\]\n]{0,300})\]\(\s{0,3}(https?://[^\s)]{1,2000})", re.I)
_BARE_URL = re.compile(r"https?://[^\s)\"'`]{1,2000}", re.I)
_PLACEHOLDER = re.compile(r"\{\{?\s{0,2}[\w .:-]{1,40}\}\}?|\$\{?[A-Za-z_]{2,30}\}?|<[\w -]{2,30}>|%[a-z_]{3,30}%"
                          r"|\[(?:[A-Z_]{3,30}|[a-z_ ]{3,30})\]|\b(?:INSERT|PUT|ADD)_[A-Z_]{2,30}\b|\bX{4,}\b")
_SENSITIVE_NAME = re.compile(r"secret|passw|token|key|conversation|chat|history|prompt|memory|summary|context|message"
                             r"|email|credential|ssn|user|data|info|name|query|question|answer|session|cookie", re.I)
_B64ISH = re.compile(r"^[A-Za-z0-9+/_-]{32,}={0,2}$")

# Hidden characters
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad"
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_INVISIBLE_RE = re.compile("[%s%s\U000e0000-\U000e007f]" % (_ZERO_WIDTH, _BIDI))
_TAG_RUN = re.compile("[\U000e0000-\U000e007f]{1,4096}")
# Between two ASCII letters any invisible is suspect; between other letters only the ones no script needs
# (Persian and Indic text use ZWNJ/ZWJ, German hyphenation the soft hyphen, emoji sequences ZWJ).
_ZW_IN_WORD = re.compile("[A-Za-z][%s]{1,8}(?=[A-Za-z])|[^\\W\\d_][\u200b\u2060\ufeff\u2061-\u2064]{1,8}(?=[^\\W\\d_])"
                         % _ZERO_WIDTH.replace("\u00ad", ""))
_ZW_RUN = re.compile("[%s]{12,4096}" % _ZERO_WIDTH)
_BIDI_RE = re.compile("[%s]" % _BIDI)
# letters a model reads as ASCII though no ASCII rule matches them: full-width forms, mathematical alphanumerics
_COMPAT_RE = re.compile("[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\U0001d400-\U0001d7ff]")

_HIDDEN_STYLE = re.compile(
    r"display\s{0,3}:\s{0,3}none|visibility\s{0,3}:\s{0,3}hidden|font-size\s{0,3}:\s{0,3}0(?:\.0{1,3})?\s{0,3}(?:px|pt|em|rem|%)?\s{0,3}(?:;|!|$)"
    r"|opacity\s{0,3}:\s{0,3}0(?:\.0{1,3})?\s{0,3}(?:;|!|$)|(?:height|width)\s{0,3}:\s{0,3}0(?:px)?\s{0,3};[^\"']{0,80}overflow\s{0,3}:\s{0,3}hidden"
    r"|(?:left|top|text-indent)\s{0,3}:\s{0,3}-\d{4,6}px", re.I)
_WHITE = r"(?:white|#fff(?:fff)?\b|rgba?\(\s{0,2}255\s{0,2},\s{0,2}255\s{0,2},\s{0,2}255)"
_WHITE_FG = re.compile(r"(?<![-\w])color\s{0,3}:\s{0,3}" + _WHITE, re.I)
_WHITE_BG = re.compile(r"background(?:-color)?\s{0,3}:\s{0,3}" + _WHITE, re.I)
_OPEN_TAG = re.compile(r"<([a-zA-Z][a-zA-Z0-9]{0,10})\b([^<>]{0,600})>")
_STYLE_ATTR = re.compile(r"""style\s{0,3}=\s{0,3}(?:"([^"]{0,600})"|'([^']{0,600})')|\bhidden\b(?!\s{0,2}=\s{0,2}["']?false)""", re.I)
_TAG_STRIP = re.compile(r"<[^<>]{0,600}>")

# Encoded blobs
_B64_BLOB = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{24,}={0,2}")
_HEX_BLOB = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{32,}(?![0-9A-Fa-f])|(?:\\x[0-9A-Fa-f]{2}){8,}|(?:\\u00[0-9A-Fa-f]{2}){8,}")
_PCT = re.compile(r"%[0-9A-Fa-f]{2}")
# rot13 of ignore, disregard, forget, instruction(s), system, previous, assistant, send, from now, password,
# secret, tool, you must / you will, conversation
_ROT13_GATE = re.compile(r"\b(?:vtaber|qvfertneq|sbetrg|vafgehpgvbaf?|flfgrz|cerivbhf|nffvfgnag|fraq|sebz\s{1,3}abj"
                         r"|cnffjbeq|frperg|gbby|lbh\s{1,3}(?:zhfg|jvyy)|pbairefngvba)\b", re.I)
_DECODE_CUE = re.compile(r"\b(?:decode|base64|rot-?13|hex|decrypt|deobfuscate)\b[^.\n]{0,60}?"
                         r"\b(?:follow|execute|obey|run|do\s{1,3}what|carry\s{1,3}out|act\s{1,3}on|apply)\b", re.I)

# Context cues
_FENCE = re.compile(r"^[ \t]{0,3}(?:```|~~~)", re.M)
_FRAMING = re.compile(
    r"(?<![.\w/-])(?:e\.g\.|i\.e\.|for\s{1,3}example|for\s{1,3}instance|such\s{1,3}as|example|examples|like|known\s{1,3}as|called"
    r"|phrases?|strings?|payloads?|attacks?|attackers?|injections?|injected|jailbreaks?|malicious|adversar\w{0,6}|detect\w{0,4}"
    r"|classifier|red[\s-]team\w{0,3}|filter\w{0,3}|patterns?|technique|vulnerab\w{0,6}|exploit\w{0,4}|threat|owasp"
    r"|researchers?|the\s{1,3}text|contains?|containing|quoted?|sample|beispiel|z\.\s?b\.|angriff\w{0,2}|exemple|attaques?"
    r"|ejemplo|ataques?|esempio|attacchi|attacco|exemplo|voorbeeld|aanval\w{0,2}|пример\w{0,2}|атак\w{0,2})(?![\w/-]|\.\w)"
    r"|例如|比如|攻击|攻撃|例えば|たとえば", re.I)
_ADDRESSED = re.compile(r"\b(?:your\s{1,3}(?:reply|answer|response|output)|when\s{1,3}you\s{1,3}read\s{1,3}this"
                        r"|on\s{1,3}(?:every|each)\s{1,3}(?:turn|request|repository|message|reply)|follow\s{1,3}what\s{1,3}it\s{1,3}says"
                        r"|before\s{1,3}(?:answering|responding|replying))", re.I)
_SENSITIVE_TARGET = re.compile(r"~/\.ssh|~/\.aws|\.bashrc|\.zshrc|\.profile\b|\.env\b|id_rsa|/etc/passwd|/etc/shadow"
                               r"|\.aws/credentials|\.netrc\b|\.npmrc\b|\.pgpass\b", re.I)
_AI = re.compile(r"\b(?:ai|a\.i\.|assistants?|llms?|language\s{1,3}models?|chatbots?|agents?|copilot|claude|chatgpt|gpt-?\d?"
                 r"|gemini|bots?|ki|ia|ии|nlp\s{1,3}model)\b|助手|人工智能|アシスタント", re.I)
_STEALTH = re.compile(r"\b(?:without\s{1,3}(?:asking|telling|confirm\w{0,5}|informing|notifying|mentioning|permission)"
                      r"|do\s{1,3}not\s{1,3}(?:tell|inform|mention|ask|reveal|show|notify)|don'?t\s{1,3}(?:tell|mention|ask|reveal|show)"
                      r"|silently|secretly|quietly|covertly|before\s{1,3}(?:responding|answering|replying|you\s{1,3}(?:reply|respond|answer))"
                      r"|(?:immediately|right\s{1,3}now|automatically)\b|the\s{1,3}user\s{1,3}(?:must|should|will)\s{1,3}not)", re.I)
_CONDITION = re.compile(r"^[\s,]{0,3}(?:(?!and\b|then\b|und\b|et\b|y\b|e\b|en\b|и\b)[\w'-]{1,15}[\s,]{1,3}){0,3}?(?:(?:only\s{1,3})?if\b|when\b|unless\b|in\s{1,3}case\b|for\s{1,3}now\b|wenn\b|falls\b"
                        r"|si\b|se\b|als\b|indien\b|если\b|когда\b|如果|场合|場合)", re.I)
_QUOTES_OPEN = "\"'“‘«„「『"
_TOPICAL = re.compile(r"\s{0,3}(?:\w{1,12}\s{1,3}){0,2}?(?:about|regarding|concerning|on\s{1,3}how|for\s{1,3}(?!(?:this|the|our|your|all|every|each|any)"
                      r"\s{1,3}(?:conversation|chat|session|turn|reply|answer|response|request|user|rest))(?:install|setting|using|the\s{1,3}\w{1,12}\s{1,3}(?:step|section|page))?)\b", _I)
_MODAL_BEFORE = re.compile(r"\b(?:to|will|can|may|might|could|would|cannot|can'?t|never|not|won'?t|ask\w{0,2}\s{1,3}(?:it|them|the\s{1,3}\w{1,12})\s{1,3}to"
                           r"|tells?\s{1,3}\w{1,20}\s{1,3}to|lets?\s{1,3}you|how\s{1,3}to)\s{1,3}$", _I)
_CONDITION_BEFORE = re.compile(r"(?:^|[\s(,])(?:if|when|unless|whenever|wenn|falls|sofern|si|se|als|indien|если|когда|caso)\b|如果|若是|場合|なら", _I)
_OPEN_SINGLE = re.compile(r"(?<![\w])['‘](?=\w)")
_CLOSE_SINGLE = re.compile(r"(?<=[\w.!?])['’](?![\w])")


# Every rule id a scan can report but the operator's ("deny_pattern.<index>", listed in Guard.rule_ids)
RULE_IDS = frozenset({rid for rid, *_ in _SIMPLE} | {
    "override.ignore_previous", "override.ignore_instructions",
    "exfil.markdown_image_data", "exfil.markdown_link_data", "exfil.url_placeholder", "exfil.url_long_param",
    "hidden.tag_characters", "hidden.zero_width", "hidden.bidi_control", "hidden.html_comment", "hidden.css_hidden",
    "encoded.base64", "encoded.hex", "encoded.url_encoded", "encoded.rot13", "encoded.decode_and_follow"})


class Guard:
    """A compiled rule set: the static rules plus the operator's ``deny_patterns`` (regexes, compiled once)."""

    def __init__(self, deny_patterns=()):
        if isinstance(deny_patterns, str):
            deny_patterns = (deny_patterns,)
        self.deny = []
        for i, pattern in enumerate(deny_patterns or ()):
            if not isinstance(pattern, str) or not pattern:
                raise ValueError("deny pattern %d must be a non-empty string, got %r" % (i, pattern))
            try:
                self.deny.append(re.compile(pattern, _I | re.M))
            except re.error as e:
                raise ValueError("deny pattern %d %r is not a valid regular expression: %s" % (i, pattern, e)) from None
        self.rule_ids = RULE_IDS | {"deny_pattern.%d" % i for i in range(len(self.deny))}

    def scan(self, text):
        """Every finding in ``text``, sorted by position; ``[]`` for clean text or a non-string.  Never raises."""
        if not isinstance(text, str) or not text:
            return []
        try:
            return self._scan(text)
        except Exception:
            # a rule bug must not take the request down (the rules are fuzzed in tests/test_guard.py);
            # it is logged, without the text, and the chunk passes unscreened
            logging.getLogger("ragproxy").exception("the poisoning guard failed on a %d-character text", len(text))
            return []

    def _scan(self, text):
        budget = [_DECODE_BUDGET, _MAX_BLOBS]
        found = _plain(text)
        plain_rules = {f.rule_id for f in found}
        found.extend(_exfil_urls(text))
        found.extend(_hidden(text, budget, plain_rules))
        found.extend(_encoded(text, budget))
        for i, rx in enumerate(self.deny):
            for m in rx.finditer(text):
                found.append(Finding("deny_pattern.%d" % i, "deny_pattern", 1.0, m.start(), m.end()))
                if m.end() == m.start() and len(found) > 10000:
                    break
        return _merge(found)


def _merge(found):
    """One finding per rule and overlapping span (the most confident), sorted by position."""
    found.sort(key=lambda f: (f.rule_id, f.start, -f.confidence))
    out = []
    for f in found:
        last = out[-1] if out else None
        if last is not None and last.rule_id == f.rule_id and f.start < last.end:
            if f.confidence > last.confidence or f.end > last.end:
                out[-1] = Finding(f.rule_id, f.category, max(f.confidence, last.confidence), last.start, max(f.end, last.end))
            continue
        out.append(f)
    out.sort(key=lambda f: (f.start, f.end, f.rule_id))
    return out


_LOOKBACK = 400   # how far back a cue is looked for on the match's line (a 1 MB line must not cost 1 MB per match)


class _Context:
    """Cues around a match in one text: code spans/fences, quotes, framing, addressee, conditions."""

    def __init__(self, text):
        self.text = text
        self.fences = [m.start() for m in _FENCE.finditer(text)] if "```" in text or "~~~" in text else []

    def in_code(self, start):
        if self.fences and bisect.bisect_right(self.fences, start) % 2 == 1:
            return True
        line_start = self.text.rfind("\n", max(0, start - _LOOKBACK), start) + 1 or max(0, start - _LOOKBACK)
        if self.text.count("`", line_start, start) % 2 == 1:
            return True
        line = self.text[line_start:start]
        stripped = line.lstrip()
        # an indented code line, a shell or REPL prompt, a code comment (not a markdown heading)
        return (line.startswith(("    ", "\t")) or stripped.startswith(("//", "/*", "* ", ">>>", "$ ", "-- "))
                or stripped.startswith("#") and not re.match(r"#{1,6} [A-Z]", stripped))

    def quoted(self, start):
        text = self.text
        if start > 0 and text[start - 1] in _QUOTES_OPEN or start > 1 and text[start - 2] in _QUOTES_OPEN and text[start - 1] in " *_":
            return True
        line = text[text.rfind("\n", max(0, start - _LOOKBACK), start) + 1 or max(0, start - _LOOKBACK):start]
        if line.count('"') % 2 == 1 or line.count("\u201c") > line.count("\u201d") or line.count("\u00ab") > line.count("\u00bb") \
                or line.count("\u201e") > line.count("\u201c") or line.count("\u300c") > line.count("\u300d"):
            return True
        return len(_OPEN_SINGLE.findall(line)) > len(_CLOSE_SINGLE.findall(line))

    def adjust(self, conf, start, end, category):
        text = self.text
        before = text[max(0, start - 200):start]
        para = before.rsplit("\n\n", 1)[-1]
        after = text[end:end + 120]
        code = self.in_code(start)
        if code:
            conf -= 0.15 if category == "tool_coercion" else 0.35
        if self.quoted(start):
            conf -= 0.3
        line_start = text.rfind("\n", max(0, start - _LOOKBACK), start) + 1 or max(0, start - _LOOKBACK)
        if text[line_start:start].lstrip().startswith(">") and category != "role_hijack":
            conf -= 0.1
        if _FRAMING.search(para[-160:]) or _FRAMING.search(after.split("\n\n", 1)[0][:60]):
            conf -= 0.3
        if category in ("instruction_override", "role_hijack", "tool_coercion") and _MODAL_BEFORE.search(text, max(0, start - 40), start):
            conf -= 0.3
        if category == "instruction_override":
            sentence = _clause(text, start - 120, start, start, start)
            if _CONDITION.search(after) or _CONDITION_BEFORE.search(sentence):
                conf -= 0.4
        window = para[-160:] + " " + after
        if _AI.search(window) or _ADDRESSED.search(window):
            conf += 0.25 if category == "tool_coercion" else 0.12
        if category == "tool_coercion" and _SENSITIVE_TARGET.search(text, start, end + 120):
            conf += 0.15
        if _STEALTH.search(window):
            conf += 0.2 if category in ("tool_coercion", "exfiltration") else 0.05
        return min(1.0, max(0.0, round(conf, 3)))


def _plain(text, ctx=None, shift=None):
    """The text rules (no decoding).  ``shift`` maps a span of ``text`` to the caller's span."""
    ctx = ctx or _Context(text)
    out = []
    lowered = text.lower()

    counts = {}

    def add(rid, cat, conf, start, end):
        # a text with more than _MAX_PER_RULE hits of one rule is flagged by the first ones already;
        # the rest would only cost time on pathological input
        counts[rid] = counts.get(rid, 0) + 1
        if counts[rid] > _MAX_PER_RULE:
            return
        conf = ctx.adjust(conf, start, end, cat)
        if shift is not None:
            start, end = shift(start, end)
        out.append(Finding(rid, cat, conf, start, end))

    candidates = []
    for lang, verb, noun, qual in _LANG_RULES:
        if not any(map(lowered.__contains__, _LANG_GATES[lang])):
            continue
        for start, end, backward in _pairs(text, verb, noun, lang):
            if len(candidates) > 20 * _MAX_PER_RULE:
                break
            # qualifiers sit before the noun ("all previous instructions") or after it
            # ("les consignes précédentes", "instructions you got before"), within the clause
            around = _clause(text, start - 30, end + 40, start, end)
            strong = qual.search(around)
            conf = (0.85 if strong else 0.4) - (0.05 if backward else 0.0)
            if strong and _WEAK_NOUN.search(text, start, end):
                conf -= 0.15
            if _TOPICAL.match(text, end, end + 40):
                conf -= 0.4
            candidates.append((start, end, conf,
                               "override.ignore_previous" if strong else "override.ignore_instructions"))
    # one reading per phrase: the strongest of overlapping matches (either word order, several languages)
    candidates.sort()
    best, cluster_end = None, -1
    for cand in candidates:
        if best is not None and cand[0] >= cluster_end:
            add(best[3], "instruction_override", best[2], best[0], best[1])
            best = None
        if best is None:
            best, cluster_end = cand, cand[1]
        else:
            cluster_end = max(cluster_end, cand[1])
            best = cand if cand[2] > best[2] else best
    if best is not None:
        add(best[3], "instruction_override", best[2], best[0], best[1])
    for rid, cat, conf, rx, gate in _SIMPLE:
        if gate and not any(map(lowered.__contains__, gate)):
            continue
        for m in rx.finditer(text):
            c = conf
            if rid == "role.reveal_system_prompt" and re.search(r"\b(?:your|you\s{1,3}were\s{1,3}given)\b|\bdeine\w?\b", text[max(0, m.start() - 20):m.end()], _I):
                c += 0.25
            if rid == "role.fake_system_header" and m.start() < len(text) and text[m.start()] == "\n":
                add(rid, cat, c, m.start() + 1, m.end())
                continue
            add(rid, cat, c, m.start(), m.end())
    return out


def _clause(text, lo, hi, start, end):
    """text[lo:hi] cut to the clause around start..end (no sentence ends, newlines or quotes crossed)."""
    lo, hi = max(0, lo), min(len(text), hi)
    head = text[lo:start]
    cut = max(head.rfind(ch) for ch in ".!?;\n\"\u3002")
    tail = text[end:hi]
    stops = [i for i in (tail.find(ch) for ch in ".!?;\n\"\u3002") if i >= 0]
    return head[cut + 1:] + text[start:end] + tail[:min(stops) if stops else len(tail)]


def _url_findings(url):
    """(rule suffix, confidence) for what a URL's query carries, or None."""
    parts = urllib.parse.urlsplit(url)
    query = parts.query + ("&" + parts.path if _PLACEHOLDER.search(parts.path) else "")
    if not query and not parts.fragment:
        return None
    if _PLACEHOLDER.search(query):
        for m in _PLACEHOLDER.finditer(query):
            if _SENSITIVE_NAME.search(m.group(0)):
                return "placeholder", 0.9
        return "placeholder", 0.6
    for pair in query.split("&"):
        value = pair.split("=", 1)[-1]
        if value.startswith("data:") or value.startswith("data%3A"):
            continue
        if len(value) >= 48 and _B64ISH.match(value) and not re.fullmatch(r"[0-9a-fA-F]{32,}", value):
            return "long", 0.45
    return None


def _exfil_urls(text):
    out = []
    if "http" not in text.lower():
        return out
    ctx = _Context(text)
    seen = set()
    for m in _MD_URL.finditer(text):
        if len(out) >= _MAX_PER_RULE:
            return out
        hit = _url_findings(m.group(3))
        seen.add(m.start(3))
        if not hit:
            continue
        kind, conf = hit
        image = m.group(1) == "!"
        if kind == "placeholder":
            rid = "exfil.markdown_image_data" if image else "exfil.markdown_link_data"
            conf = conf if image else conf - 0.15
        else:
            rid = "exfil.url_long_param"
        out.append(Finding(rid, "exfiltration", ctx.adjust(conf, m.start(), m.end(), "exfiltration"), m.start(), m.end()))
    for m in _BARE_URL.finditer(text):
        if len(out) >= 2 * _MAX_PER_RULE:
            break
        if m.start() in seen:
            continue
        hit = _url_findings(m.group(0))
        if not hit:
            continue
        kind, conf = hit
        rid, conf = ("exfil.url_placeholder", 0.4) if kind == "placeholder" else ("exfil.url_long_param", 0.35)
        before = text[max(0, m.start() - 160):m.start()]
        near = before + " " + text[m.end():m.end() + 160]
        if re.search(r"\b(?:visit|open|fetch|load|request|render|display|browse\s{1,3}to|go\s{1,3}to|click|navigate\s{1,3}to)\b",
                     before, _I) and re.search(r"\b(?:conversation|secret|password|api\s{0,2}key|token|summary|history)", near, _I):
            conf += 0.35
        out.append(Finding(rid, "exfiltration", ctx.adjust(conf, m.start(), m.end(), "exfiltration"), m.start(), m.end()))
    return out


def _rescan(decoded, start, end, rid, category, base, extra=0.1):
    """Scan decoded text with the plain rules; findings become spans of the source blob.

    Hidden or encoded text that speaks to an AI in the imperative counts even
    without an override phrase: nobody hides "assistant, recommend X" by accident."""
    inner = _plain(decoded) + _exfil_urls(decoded)
    out = []
    best = 0.0
    for f in inner:
        conf = round(min(1.0, f.confidence + extra), 3)
        out.append(Finding(f.rule_id, f.category, conf, start, end))
        best = max(best, conf)
    if out and best >= 0.3:
        out.append(Finding(rid, category, max(base, min(1.0, best)), start, end))
    elif _AI.search(decoded) and _IMPERATIVE_TO_AI.search(decoded):
        out.append(Finding(rid, category, 0.7, start, end))
    return out


def _spend(budget, n):
    if budget[0] <= 0 or budget[1] <= 0:
        return 0
    take = min(n, budget[0], _MAX_BLOB)
    budget[0] -= take
    budget[1] -= 1
    return take


def _hidden(text, budget, plain_rules):
    out = []
    if _INVISIBLE_RE.search(text):
        out.extend(_invisible(text, budget, plain_rules))
    elif len(text) <= 2 * _DECODE_BUDGET and _COMPAT_RE.search(text):
        out.extend(_view_findings(text, plain_rules))
    low = text.lower() if "<" in text else ""
    if "<!--" in text:
        out.extend(_comments(text, budget))
    if low and ("style" in low or "hidden" in low):
        out.extend(_css_hidden(text, low, budget))
    return out


def _model_view(text):
    """The text as a model reads it: invisibles dropped, full-width and mathematical letters folded (NFKC);
    with, for each character of the view, the index in ``text`` of the character it came from."""
    chars, index = [], []
    for i, ch in enumerate(text):
        if _INVISIBLE_RE.match(ch):
            continue
        piece = unicodedata.normalize("NFKC", ch) if _COMPAT_RE.match(ch) else ch
        chars.append(piece)
        index.extend([i] * len(piece))
    return "".join(chars), index


def _view_findings(text, plain_rules):
    """Rules that match only in the model's view of ``text`` were evaded on purpose: they count, and more."""
    view, index = _model_view(text)
    out = []
    for f in _plain(view):
        if f.rule_id not in plain_rules:
            start = index[f.start] if f.start < len(index) else len(text)
            end = index[f.end - 1] + 1 if 0 < f.end <= len(index) else len(text)
            out.append(Finding(f.rule_id, f.category, round(min(1.0, f.confidence + 0.1), 3), start, end))
    return out


def _invisible(text, budget, plain_rules):
    out = []
    for m in _TAG_RUN.finditer(text):
        if len(out) > _MAX_PER_RULE:
            break
        run = m.group(0)
        # a subdivision flag (U+1F3F4 followed by tag letters and U+E007F) is emoji, not hidden text
        if m.start() > 0 and text[m.start() - 1] == "\U0001f3f4" and run.endswith("\U000e007f") and len(run) <= 8:
            continue
        n = _spend(budget, len(run))
        decoded = "".join(chr(ord(ch) - 0xE0000) for ch in run[:n] if 0x20 <= ord(ch) - 0xE0000 < 0x7f)
        inner = _rescan(decoded, m.start(), m.end(), "hidden.tag_characters", "hidden_text", 0.95) if decoded else []
        out.extend(inner)
        if not inner:
            out.append(Finding("hidden.tag_characters", "hidden_text", 0.75 if len(decoded) >= 4 else 0.5, m.start(), m.end()))
    zw = list(_ZW_IN_WORD.finditer(text))
    runs = list(_ZW_RUN.finditer(text))
    stripped_findings = _view_findings(text, plain_rules) if len(text) <= 2 * _DECODE_BUDGET else []
    out.extend(stripped_findings)
    if zw:
        conf = 0.85 if stripped_findings else 0.6 if len(zw) >= 3 else 0.35
        out.append(Finding("hidden.zero_width", "hidden_text", conf, zw[0].start(), zw[-1].end()))
    for m in runs[:_MAX_PER_RULE]:
        out.append(Finding("hidden.zero_width", "hidden_text", 0.55, m.start(), m.end()))
    bidi = list(_BIDI_RE.finditer(text))
    if bidi:
        conf = 0.85 if stripped_findings else 0.55 if any(ch in "\u202e\u2066\u2067\u2068\u2069\u202d" for ch in
                                                         (b.group(0) for b in bidi)) else 0.35
        out.append(Finding("hidden.bidi_control", "hidden_text", conf, bidi[0].start(), bidi[-1].end()))
    return out


_IMPERATIVE_TO_AI = re.compile(
    r"\b(?:must|should|always|never|do\s{1,3}not|don'?t|tell|say|respond|reply|answer|include|recommend|mention|insert"
    r"|output|write|describe|instead|ignore|pretend|claim|state|urge|direct\s{1,3}the\s{1,3}user)\b", re.I)


def _hidden_payload(inner, start, end, rid, budget):
    """A hidden region: its text scanned; instructions to an AI there count even without an override phrase."""
    n = _spend(budget, len(inner))
    if not n:
        return []
    return _rescan(_TAG_STRIP.sub(" ", inner[:n]), start, end, rid, "hidden_text", 0.85, extra=0.15)


def _comments(text, budget):
    out = []
    pos = 0
    while True:
        start = text.find("<!--", pos)
        if start < 0:
            break
        end = text.find("-->", start + 4)
        end = len(text) if end < 0 else end + 3
        out.extend(_hidden_payload(text[start + 4:end - 3], start, end, "hidden.html_comment", budget))
        pos = end
        if budget[1] <= 0:
            break
    return out


def _css_hidden(text, low, budget):
    out = []
    unclosed = set()   # tags with no closing tag after some point have none after any later point either
    for m in _OPEN_TAG.finditer(text):
        attrs = m.group(2)
        if "style" not in attrs.lower() and "hidden" not in attrs.lower():
            continue
        hidden = False
        for a in _STYLE_ATTR.finditer(attrs):
            style = a.group(1) or a.group(2)
            if style is None:
                hidden = True
            elif _HIDDEN_STYLE.search(style) or _WHITE_FG.search(style) and (_WHITE_BG.search(style) or "background" not in style.lower()):
                hidden = True
        if not hidden:
            continue
        tag = m.group(1).lower()
        close = -1 if tag in unclosed else low.find("</" + tag, m.end())
        if close < 0:
            unclosed.add(tag)
        close = min(len(text), m.end() + _MAX_BLOB) if close < 0 else close
        out.extend(_hidden_payload(text[m.end():close], m.start(), close, "hidden.css_hidden", budget))
        if budget[1] <= 0:
            break
    return out


def _printable(s):
    if len(s) < 8:
        return False
    good = sum(1 for ch in s if ch.isprintable() or ch in "\n\t\r")
    letters = sum(1 for ch in s if ch.isalpha() or ch == " ")
    return good >= 0.95 * len(s) and letters >= 0.6 * len(s)


def _encoded(text, budget):
    out = []
    cue = _DECODE_CUE.search(text)
    if cue:
        ctx = _Context(text)
        out.append(Finding("encoded.decode_and_follow", "encoded_payload",
                           ctx.adjust(0.6, cue.start(), cue.end(), "encoded_payload"), cue.start(), cue.end()))
    for m in _B64_BLOB.finditer(text):
        blob = m.group(0)
        if blob.isalpha() and (blob.islower() or blob.isupper()) or "/" in blob and blob.count("/") * 12 > len(blob):
            continue   # a long word, a path
        n = _spend(budget, len(blob))
        if not n:
            break
        chunk = blob[:n - n % 4] if n < len(blob) else blob
        try:
            raw = base64.urlsafe_b64decode(chunk.replace("+", "-").replace("/", "_") + "=" * (-len(chunk) % 4))
            decoded = raw.decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            continue
        if _printable(decoded):
            out.extend(_rescan(decoded, m.start(), m.end(), "encoded.base64", "encoded_payload", 0.85))
    for m in _HEX_BLOB.finditer(text):
        blob = m.group(0)
        n = _spend(budget, len(blob))
        if not n:
            break
        digits = re.sub(r"\\[xu](?:00)?", "", blob[:n]) if blob.startswith("\\") else blob[:n]
        try:
            decoded = bytes.fromhex(digits[:len(digits) - len(digits) % 2]).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            continue
        if _printable(decoded):
            out.extend(_rescan(decoded, m.start(), m.end(), "encoded.hex", "encoded_payload", 0.85))
    if "%" in text:
        out.extend(_percent(text, budget))
    gate = _ROT13_GATE.search(text)
    if gate:
        start = max(0, text.rfind("\n\n", 0, gate.start()))
        n = _spend(budget, min(len(text) - start, _MAX_BLOB))
        end = start + n
        decoded = codecs.decode(text[start:end], "rot13")
        inner = [f for f in _rescan(decoded, start, end, "encoded.rot13", "encoded_payload", 0.85)]
        out.extend(inner)
    return out


def _percent(text, budget):
    out = []
    hits = [m.start() for m in _PCT.finditer(text)]
    i = 0
    while i < len(hits):
        j = i
        while j + 1 < len(hits) and hits[j + 1] - hits[j] <= 24 and not any(
                ch.isspace() for ch in text[hits[j]:hits[j + 1]]):
            j += 1
        if j - i + 1 >= 4:
            start, end = hits[i], hits[j] + 3
            while start > 0 and not text[start - 1].isspace() and hits[i] - start < 200:
                start -= 1
            while end < len(text) and not text[end].isspace() and end - hits[j] < 200:
                end += 1
            n = _spend(budget, end - start)
            if not n:
                break
            decoded = urllib.parse.unquote_plus(text[start:start + n])
            decoded = unicodedata.normalize("NFC", decoded)
            out.extend(_rescan(decoded, start, end, "encoded.url_encoded", "encoded_payload", 0.8))
        i = j + 1
    return out
