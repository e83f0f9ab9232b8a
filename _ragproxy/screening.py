"""The guardrails' screening of one request.

Owns Screening: a model's guardrail settings applied to the chunks retrieved
for a request (redacted, then scanned by the poisoning guard and the deny
patterns: a finding drops the chunk, refuses the request, or is only
recorded) and, with ``scan: input``, to the tool results of the request's
latest round (tool_results); what it found, for the request log.  The guard
and the redactor come from the caller (Retriever keeps one of each per
setting), so this module runs none of their patterns itself.

May import: api, inject.
"""
from __future__ import annotations

import collections

from .api import ClientError
from .inject import line_range


# A guardrail refusal: the request is well formed and the client authorised,
# but ragproxy's policy will not send it on.  403, not 400: nothing in the
# request's syntax is wrong and the client cannot fix it by rewording (the
# poisoned text is a document's, or a tool's), which is what a 400 asks of it;
# and no client retries a 403 (a 5xx would be retried, in vain).
DENY_STATUS = 403
DENY_CODE = "guardrail_denied"
# What a finding's excerpt may hold: enough to read the rule's match.
_EXCERPT_CHARS = 200


class Screening:
    """One request's guardrails: the model's settings and what they found, for the request log."""

    def __init__(self, rails, guard_for, redactor_for):
        poisoning, redact = rails["context_poisoning"], rails["redact"]
        self.poisoning = poisoning["enabled"]
        self.min_confidence = poisoning["min_confidence"]
        # Deny patterns drop a chunk on their own; with the guard on, they share its action.
        self.action = poisoning["action"] if self.poisoning else "drop"
        patterns = tuple(rails["deny_patterns"])
        active = self.poisoning or bool(patterns)
        scan = poisoning["scan"] if self.poisoning else "retrieved"
        self.scan_retrieved = active and scan in ("retrieved", "both")
        self.scan_input = active and scan in ("input", "both")
        self.guard = guard_for(patterns) if active else None
        self.redactor = redactor_for(tuple(redact["categories"])) \
            if redact["enabled"] and redact["at"] == "inject" else None
        self.findings = []
        self.dropped = 0
        self.denied = None            # where the refusal came from: "retrieved" or "input"
        self.redactions = collections.Counter()
        self.budget = None

    def _findings(self, text):
        """The guard's findings in ``text`` that count: a deny pattern's always, a rule's at min_confidence."""
        return [f for f in self.guard.scan(text)
                if f.category == "deny_pattern" or (self.poisoning and f.confidence >= self.min_confidence)]

    def _note(self, findings, text, where, item, action, chunk_id=None):
        for f in findings:
            finding = {"rule_id": f.rule_id, "category": f.category, "confidence": round(f.confidence, 3),
                       "where": where, "item": item, "action": action,
                       "excerpt": text[f.start:f.end][:_EXCERPT_CHARS]}
            if chunk_id is not None:
                finding["chunk_id"] = chunk_id
            self.findings.append(finding)

    def screen_chunks(self, chunks):
        """``chunks`` redacted and screened: the ones to render (a ``deny`` raises ClientError)."""
        kept = []
        for chunk in chunks:
            if self.redactor is not None:
                text, counts = self.redactor.redact(chunk["content"])
                if counts:
                    self.redactions.update(counts)
                    chunk = dict(chunk, content=text, text=text)
            findings = self._findings(chunk["content"]) if self.scan_retrieved else ()
            if findings:
                lines = line_range(chunk)
                self._note(findings, chunk["content"], "retrieved",
                           str(chunk.get("source", "")) + (":" + lines if lines else ""), self.action,
                           chunk.get("id", ""))
                if self.action == "deny":
                    self.refuse("retrieved", findings)
                if self.action == "drop":
                    self.dropped += 1
                    continue
            kept.append(chunk)
        return kept

    def screen_input(self, endpoint, payload):
        """Screen the tool and function results of the request's latest round.

        They are the client's conversation, not ragproxy's to edit: ``deny``
        refuses the request, and ``drop`` (which would have to cut a tool
        result out of the conversation, or leave a tool call unanswered)
        records the finding as ``flag`` does.
        """
        if not self.scan_input:
            return
        action = "deny" if self.action == "deny" else "flag"
        for n, text in enumerate(tool_results(endpoint, payload), 1):
            findings = self._findings(text)
            if findings:
                self._note(findings, text, "input", f"tool_result[{n}]", action)
                if action == "deny":
                    self.refuse("input", findings)

    def mark(self):
        """Where the screening stands, for since()."""
        return len(self.findings), self.dropped, collections.Counter(self.redactions)

    def since(self, mark):
        """What was found, dropped and redacted after ``mark``: for replay() by a request
        that reuses the same screened chunks (Retriever.renders)."""
        findings, dropped, redactions = mark
        return tuple(self.findings[findings:]), self.dropped - dropped, self.redactions - redactions

    def replay(self, screened):
        """Record again what since() reported: a reused render's log fields are its first one's."""
        findings, dropped, redactions = screened
        self.findings += findings
        self.dropped += dropped
        self.redactions.update(redactions)

    def refuse(self, where, findings):
        self.denied = where
        what = "retrieved context" if where == "retrieved" else "a tool result in the request"
        rules = ", ".join(sorted({f.rule_id for f in findings}))
        raise ClientError(DENY_STATUS, f"refused by ragproxy's guardrails: {what} looks like a prompt injection "
                                       f"({rules}); the model was not called", DENY_CODE)

    def log_fields(self):
        """The request log's and the metrics' fields (reqlog.REQUEST_LOG_FIELDS)."""
        screened = self.guard is not None   # else 0 findings would claim a screening that never ran
        return {"findings": len(self.findings) if screened else None,
                "rule_ids": sorted({f["rule_id"] for f in self.findings}) if screened else None,
                "dropped": self.dropped if screened else None, "denied": self.denied,
                "redactions": dict(self.redactions) if self.redactor is not None else None,
                "guard_findings": self.findings or None, "budget": self.budget}


def tool_results(endpoint, payload):
    """The texts of the tool and function results of the request's latest round.

    Those after the model's last turn: OpenAI chat and Ollama ``tool`` (and
    ``function``) messages, Anthropic ``tool_result`` blocks, Responses
    ``function_call_output`` items.  Earlier rounds' results were screened
    when they were new; one that was refused is still after the model's last
    turn, since no answer came.
    """
    if endpoint == "responses":
        items = payload.get("input")
        if not isinstance(items, list):
            return []
        items = [i for i in items if isinstance(i, dict)]
        last = max((n for n, i in enumerate(items) if i.get("role") == "assistant" or i.get("type") in (
            "function_call", "custom_tool_call", "reasoning")), default=-1)
        return [t for i in items[last + 1:] if i.get("type") in ("function_call_output", "custom_tool_call_output")
                for t in _texts(i.get("output"))]
    messages = payload.get("messages")
    if endpoint not in ("chat", "messages", "ollama_chat") or not isinstance(messages, list):
        return []
    messages = [m for m in messages if isinstance(m, dict)]
    last = max((n for n, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    out = []
    for message in messages[last + 1:]:
        if endpoint == "messages":
            if message.get("role") == "user" and isinstance(message.get("content"), list):
                out += [t for block in message["content"] if isinstance(block, dict)
                        and block.get("type") == "tool_result" for t in _texts(block.get("content"))]
        elif message.get("role") in ("tool", "function"):
            out += _texts(message.get("content"))
    return out


def _texts(content):
    """A result's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return [content] if content else []
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]
    return []
