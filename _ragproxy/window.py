"""window_fit: keep a request's message list inside the model's context window, and the known-window table.

A long conversation outgrows a local model's window (a 32k-token model, 20k
tokens of tool definitions, a history that grows every tool round); the
upstream then refuses the request or, as Ollama does, silently truncates
it to its num_ctx.  window_fit drops the oldest history first, in whole
pieces, so the request fits the budget

    (input_budget_tokens, else window - completion_reserve_tokens) - fixed_tokens

where ``fixed_tokens`` is what the caller counted outside the message list
(tools, Anthropic ``system``, Responses ``instructions``).

What stays: the leading system/developer prefix (messages or Responses
items with those roles at the start of the list), the current turn (the
newest user message with text in it, and everything after it) and a
contiguous run of the newest history before it.  What goes: the oldest
history between the two, cut at the start of a protocol unit that begins
with a user message (at any unit when a chat or Responses history has no
user message at all).  A protocol unit is never split:

* chat, ollama_chat: a message with every role=tool (or legacy
  role=function) message after it, so an assistant message with tool_calls
  keeps its results;
* messages (Anthropic): a message with the user messages after it that
  carry tool_result blocks, so a tool_use keeps its tool_result;
* responses: an item with the *_output items after it, calls that follow a
  call or a reasoning item, and an assistant message after a reasoning item
  (OpenAI rejects a function_call without its reasoning item).

Cutting at user messages only keeps every kept turn with the instruction
that started it and keeps roles alternating: Anthropic wants the list to
start with a user message, and strict chat templates (Mistral, Gemma) raise
on anything else.  When the prefix and the current turn alone do not fit,
the lever skips (not_eligible) and the list goes upstream whole: the
upstream's own "prompt too long" is a clearer answer than a request missing
its current turn.

Prefix stability (prompt caching): a cut changes the request's prefix from
the cut on, so the upstream's prompt cache misses once.  Cutting one unit
per round as the history grows would do that on every round, so a cut goes
down to a low-water mark (LOW_WATER of the budget) and the cut then stays
where it is, the rounds after it appending to a stable prefix, until the
budget is hit again.  The lever is stateless (a client re-sends the whole
history every round, and replicas share nothing), so the cut is not
remembered but recomputed: ``_cut`` replays the conversation's growth one
unit at a time with the same rule, which gives every request the cut the
previous request got unless the budget forces a new one.  In 20 generated
agent loops of 30 rounds each, on a budget of half the final history, the
prefix changed on 56 of the 600 rounds, against 103 when a cut drops only
what it must (tests/test_window.py).  Cuts land on user messages, so when
the budget holds only two or three turns the prefix changes about once per
turn whatever the low-water mark.

Token estimate of a message: ``estimate`` of its texts plus MESSAGE_OVERHEAD;
tool calls, tool results, Anthropic blocks and other structured fields
count by their JSON text, an image by IMAGE_TOKENS (its base64 bytes are not
what the model pays).  Deterministic: the same list gives the same result.
The input is never mutated; the result shares every kept message.

May import: compress, defaults, marked.
"""
from __future__ import annotations

import bisect
import fnmatch
import json

from . import marked
from .compress import Outcome
from .defaults import WINDOW_COMPLETION_RESERVE_TOKENS

LEVER = "window_fit"

# Per message, the tokens a chat template adds around its content: Llama 3's
# <|start_header_id|>role<|end_header_id|>"\n\n" ... <|eot_id|> and ChatML's
# <|im_start|>role"\n" ... <|im_end|>"\n" are 5; OpenAI counts 3 or 4.  The
# higher figure errs toward fitting.
MESSAGE_OVERHEAD = 5
# An image part or an Ollama ``images`` entry: about the most a model bills
# for one image (Anthropic ~1,600 for 1.15 megapixels; OpenAI high detail
# 1,105 for 1024x1024 on gpt-4o).
IMAGE_TOKENS = 1600
# A cut goes down to this share of the budget, so later rounds keep their prefix.
LOW_WATER = 0.75

# Context windows in tokens, first match wins; globs matched case-insensitively
# against the model name, and against its last path part ("openai/gpt-4o").
# Ollama names carry a tag ("qwen2.5-coder:7b"), hence the trailing "*".
# A family whose sizes differ gets its smallest common window: too small
# trims early, too large lets the upstream refuse.  Override per model with
# `context_window`.  Ollama serves a model with its own num_ctx
# (OLLAMA_CONTEXT_LENGTH), often far below these: set context_window to it.
KNOWN_WINDOWS = (
    # Meta model cards: Llama 3 8K; Llama 3.1/3.2/3.3 128K; Llama 2 4K; Code Llama 16K.
    ("llama3.1*", 131072),
    ("llama3.2*", 131072),
    ("llama3.3*", 131072),
    ("llama3*", 8192),
    ("llama2*", 4096),
    ("codellama*", 16384),
    # Qwen model cards (config max_position_embeddings; YaRN extension not on by default) and the Ollama
    # library pages: Qwen2.5 and Qwen2.5-Coder 32K, Qwen3 40K as Ollama ships it, Qwen3-Coder 256K.
    ("qwen2.5-coder*", 32768),
    ("qwen2.5*", 32768),
    ("qwen2*", 32768),
    ("qwen3-coder*", 262144),
    ("qwen3*", 40960),
    # DeepSeek model cards / Ollama library: Coder V2 160K, Coder (v1) 16K, R1 distills 128K.
    ("deepseek-coder-v2*", 163840),
    ("deepseek-coder*", 16384),
    ("deepseek-r1*", 131072),
    # Mistral AI docs: Mistral 7B v0.3 32K, Nemo 128K, Large 2 128K, Small 32K, Mixtral 8x7B 32K,
    # 8x22B 64K, Codestral 22B 32K, Devstral 128K.
    ("mistral-nemo*", 131072),
    ("mistral-large*", 131072),
    ("mistral*", 32768),
    ("mixtral:8x22b*", 65536),
    ("mixtral-8x22b*", 65536),
    ("mixtral*", 32768),
    ("codestral*", 32768),
    ("devstral*", 131072),
    # Google model cards: Gemma 2 8K; Gemma 3 128K, its 1B 32K.
    ("gemma2*", 8192),
    ("gemma3:1b*", 32768),
    ("gemma3*", 131072),
    # Microsoft model cards: Phi-3 mini/medium 4K unless the -128k variant, Phi-3.5 128K, Phi-4 16K,
    # Phi-4-mini 128K.
    ("phi3*128k*", 131072),
    ("phi3.5*", 131072),
    ("phi3*", 4096),
    ("phi4-mini*", 131072),
    ("phi4*", 16384),
    # StarCoder2 paper: 16,384.
    ("starcoder2*", 16384),
    # OpenAI model pages.  gpt-5: 400K in all, of which 128K are output, so 272K of input.
    ("gpt-oss*", 131072),
    ("gpt-4o*", 128000),
    ("gpt-4.1*", 1047576),
    ("gpt-4.5*", 128000),
    ("gpt-4-turbo*", 128000),
    ("gpt-4-1106*", 128000),
    ("gpt-4-0125*", 128000),
    ("gpt-4-32k*", 32768),
    ("gpt-4*", 8192),
    ("gpt-3.5-turbo*", 16385),
    ("gpt-5-chat*", 128000),
    ("gpt-5*", 272000),
    ("o1-mini*", 128000),
    ("o1-preview*", 128000),
    ("o1*", 200000),
    ("o3*", 200000),
    ("o4-mini*", 200000),
    # Anthropic docs: 200K for every Claude 3 and later model (1M for some only behind a beta header).
    ("claude-2*", 100000),
    ("claude-instant*", 100000),
    ("claude-*", 200000),
    # Google Gemini docs: 1.5 Pro 2M, 1.0 Pro 32K, the others (1.5 Flash, 2.0, 2.5) 1M.
    ("gemini-1.5-pro*", 2097152),
    ("gemini-1.0*", 32760),
    ("gemini-pro", 32760),
    ("gemini-*", 1048576),
)


def model_window(model, override=None):
    """The context window of ``model`` in tokens: ``override`` when given, else KNOWN_WINDOWS', else None."""
    if override is not None:
        return override
    if not isinstance(model, str) or not model:
        return None
    name = model.lower()
    names = (name, name.rsplit("/", 1)[-1]) if "/" in name else (name,)
    for pattern, tokens in KNOWN_WINDOWS:
        if any(fnmatch.fnmatchcase(n, pattern) for n in names):
            return tokens
    return None


# -- token estimate ----------------------------------------------------------

_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image", "image_url", "input_image")


def _json(value):
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):     # a circular structure: no JSON came in like that
        return str(value)


def _part_tokens(part, estimate):
    if isinstance(part, str):
        return estimate(part)
    if isinstance(part, dict):
        kind = part.get("type")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            return estimate(part["text"])
        if kind in _IMAGE_PARTS:
            return IMAGE_TOKENS
    return estimate(_json(part))


def message_tokens(message, estimate):
    """Estimated tokens of one message or Responses item (see the module docstring)."""
    if not isinstance(message, dict):
        return MESSAGE_OVERHEAD + estimate(_json(message))
    total = MESSAGE_OVERHEAD
    content = message.get("content")
    if isinstance(content, str):
        total += estimate(content)
    elif isinstance(content, list):
        total += sum(_part_tokens(p, estimate) for p in content)
    elif content is not None:
        total += estimate(_json(content))
    images = message.get("images")
    if isinstance(images, list):
        total += IMAGE_TOKENS * len(images)
    elif images is not None:
        total += estimate(_json(images))
    rest = {k: v for k, v in message.items() if k not in ("role", "content", "images")}
    if rest:
        total += estimate(_json(rest))
    return total


# -- protocol units ----------------------------------------------------------

_SYSTEM_ROLES = ("system", "developer")
_CHAT_RESULT_ROLES = ("tool", "function")


def _role(message):
    return message.get("role") if isinstance(message, dict) else None


def _type(message):
    return message.get("type") if isinstance(message, dict) else None


def _has_block(message, kind):
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == kind for p in content)


def _responses_kind(item):
    """call (function_call, custom_tool_call, local_shell_call, computer_call, ...), output, reasoning, other."""
    kind = _type(item)
    if isinstance(kind, str) and kind.endswith("_call"):
        return "call"
    if isinstance(kind, str) and kind.endswith("_output"):
        return "output"
    if kind == "reasoning":
        return "reasoning"
    return "other"


def _continues(messages, i, api):
    """Whether messages[i] belongs to the protocol unit of messages[i - 1]."""
    message = messages[i]
    if api in ("chat", "ollama_chat"):
        return _role(message) in _CHAT_RESULT_ROLES
    if api == "messages":
        return _role(message) == "user" and _has_block(message, "tool_result")
    kind, before = _responses_kind(message), _responses_kind(messages[i - 1])
    if kind == "output":
        return True
    if kind == "call":
        return before in ("call", "reasoning")
    return before == "reasoning" and _role(message) == "assistant"


def _has_text(content):
    if isinstance(content, str):
        return bool(content.strip())
    if not isinstance(content, list):
        return False
    return any((isinstance(p, str) and p.strip()) or
               (isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
                and p["text"].strip()) for p in content)


def _is_user_start(message, api):
    """A unit that starts with this message may lead the kept history: a user message with text in it.

    Not one holding only images: Codex hands a view_image result back that
    way in the middle of an agent loop, and a cut there would drop the
    loop's instruction.
    """
    if _role(message) != "user" or not _has_text(message.get("content")):
        return False
    if api == "responses":
        return _type(message) in (None, "message")
    return True


def units(messages, api, start=0):
    """``[(first, end)]``: ``messages[start:]`` cut into protocol units, in order."""
    out = []
    for i in range(start, len(messages)):
        if out and _continues(messages, i, api):
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _prefix_length(messages):
    n = 0
    while n < len(messages) and _role(messages[n]) in _SYSTEM_ROLES:
        n += 1
    return n


# -- the lever ---------------------------------------------------------------

def _check(name, value, low, optional=False):
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError("%s must be an integer >= %d, not %r" % (name, low, value))


def _cut(costs, starts, fixed, budget, low):
    """The index of the first kept unit, or None when the current turn does not fit.

    ``costs[k]`` is unit k's tokens, ``starts[k]`` whether it may lead the
    kept history, ``fixed`` the prefix's tokens.  The growth of the
    conversation is replayed: after each unit, when the units from the cut
    on exceed the budget, the cut moves to the first allowed unit from which
    they fit under ``low`` (else under the budget), never past the current
    turn of that moment.  The cut a shorter history got is where a longer
    one starts from, so the result moves only when the budget forces it.
    """
    sums = [0]
    for c in costs:
        sums.append(sums[-1] + c)
    n = len(costs)
    any_start = any(starts)
    cut = 0
    # The units a cut may go to, in order, and the tokens before each; the last is the current turn
    # of that moment, which a cut never passes.
    allowed, allowed_sums = [], []
    for k in range(n):      # after unit k is added
        if starts[k] or not any_start:
            allowed.append(k)
            allowed_sums.append(sums[k])
        total = fixed + sums[k + 1]
        if total - sums[cut] <= budget:
            continue
        first = bisect.bisect_left(allowed, cut)
        for limit in (low, budget):
            # Fewer tokens from a later unit on: the first that fits is found by bisection.
            i = bisect.bisect_left(allowed_sums, total - limit, first)
            if i < len(allowed):
                cut = allowed[i]
                break
    if fixed + sums[n] - sums[cut] > budget:
        return None
    return cut


def window_fit(messages, api, estimate, *, window, fixed_tokens=0,
               completion_reserve_tokens=WINDOW_COMPLETION_RESERVE_TOKENS,
               input_budget_tokens=None, low_water=LOW_WATER):
    """``(messages, Outcome)``: the list with its oldest history dropped to fit the budget.

    ``low_water`` (a share of the budget, 0 < x <= 1) is where a cut goes
    down to; 1.0 cuts as little as fits, which changes the prefix on every
    round once the budget is reached (for comparisons; not a config key).

    Reasons: applied; not_needed (it fits already); unknown_model_window
    (``window`` None and no ``input_budget_tokens``); not_eligible (not a
    list, e.g. a Responses string input, or the prefix and the current turn
    alone exceed the budget); no_savings.  Token counts cover ``messages``.
    """
    if api not in marked.APIS:
        raise ValueError("unknown API %r" % (api,))
    _check("window", window, 1, optional=True)
    _check("fixed_tokens", fixed_tokens, 0)
    _check("completion_reserve_tokens", completion_reserve_tokens, 0)
    _check("input_budget_tokens", input_budget_tokens, 1, optional=True)
    if isinstance(low_water, bool) or not isinstance(low_water, (int, float)) or not 0 < low_water <= 1:
        raise ValueError("low_water must be a number in (0, 1], not %r" % (low_water,))
    if input_budget_tokens is not None:
        budget = input_budget_tokens - fixed_tokens
    elif window is None:
        return messages, Outcome(LEVER, False, "unknown_model_window")
    else:
        budget = window - completion_reserve_tokens - fixed_tokens
    if not isinstance(messages, list):
        return messages, Outcome(LEVER, False, "not_eligible", detail="the input is not a list")
    prefix = _prefix_length(messages)
    costs_of = [message_tokens(m, estimate) for m in messages]
    before = sum(costs_of)
    if before <= budget:
        return messages, Outcome(LEVER, False, "not_needed", before, before)
    spans = units(messages, api, prefix)
    costs = [sum(costs_of[a:b]) for a, b in spans]
    starts = [_is_user_start(messages[a], api) for a, _ in spans]
    if api == "messages" and not any(starts):
        return messages, Outcome(LEVER, False, "not_eligible", before, before, "no user message to start with")
    fixed = sum(costs_of[:prefix])
    cut = _cut(costs, starts, fixed, budget, int(budget * low_water)) if spans else None
    if cut is None:
        return messages, Outcome(LEVER, False, "not_eligible", before, before,
                                 "the current turn needs more than the budget of %d tokens" % max(budget, 0))
    kept = messages[:prefix] + messages[spans[cut][0]:]
    after = sum(costs_of[:prefix]) + sum(costs[cut:])
    if after >= before:
        return messages, Outcome(LEVER, False, "no_savings", before, before)
    return kept, Outcome(LEVER, True, "applied", before, after,
                         "dropped %d of %d messages; budget %d tokens" % (len(messages) - len(kept),
                                                                          len(messages), budget))
