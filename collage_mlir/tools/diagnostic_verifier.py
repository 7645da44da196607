"""``--verify-diagnostics`` for collage-opt: checks the diagnostics a run emits against the input's
``expected-*`` comments, as MLIR's SourceMgrDiagnosticVerifierHandler does for mlir-opt.

    %0 = stablehlo.tanh %a : tensor<4xf32>  // expected-error {{cannot take it}}
    // expected-error @+1 {{unknown op id 42}}
    // expected-error-re @below {{op {{[0-9]+}} is also in}}
    // expected-error @unknown {{no location}}

A comment names a severity (error, warning, remark, note), optionally ``-re`` (``{{regex}}`` blocks in
the text), and a line: its own, ``@+N``/``@-N`` relative to it, ``@above``/``@below`` (the nearest line
without an expected-* comment) or ``@unknown`` (a diagnostic without a file location). The text must be
a substring of the message. A diagnostic no comment expects, or a comment no diagnostic matched, fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..ir import ir

_EXPECTED = re.compile(r"expected-(error|note|remark|warning)(-re)? *(@([+-][0-9]+|above|below|unknown))? *"
                       r"\{\{(.*)\}\}\s*$")
_FILE_LOC = re.compile(r'"([^"]*)":(\d+):(\d+)')
_REGEX_BLOCK = re.compile(r"\{\{(.*?)\}\}")


@dataclass
class Expected:
    """One ``expected-*`` comment: severity, the line it is about (None: ``@unknown``), its text."""

    severity: str
    line: int | None
    text: str
    regex: bool
    comment_line: int
    matched: bool = False

    def matches(self, message: str) -> bool:
        if not self.regex:
            return self.text in message
        parts, pos = [], 0
        for m in _REGEX_BLOCK.finditer(self.text):
            parts += [re.escape(self.text[pos:m.start()]), m.group(1)]
            pos = m.end()
        parts.append(re.escape(self.text[pos:]))
        return re.search("".join(parts), message) is not None


@dataclass
class Seen:
    """A diagnostic as emitted: severity, (file, line, column) or None when unknown, message."""

    severity: str
    where: tuple[str, int, int] | None
    message: str


def parse_expected(text: str) -> list[Expected]:
    """The ``expected-*`` comments of an input, with the (1-based) line each is about."""
    lines = text.split("\n")
    designated = [_EXPECTED.search(line) for line in lines]
    found = []
    for k, m in enumerate(designated):
        if m is None:
            continue
        lineno, offset = k + 1, m.group(4)
        if offset is None:
            target: int | None = lineno
        elif offset == "unknown":
            target = None
        elif offset == "above":
            target = next((j + 1 for j in range(k - 1, -1, -1) if designated[j] is None), 0)
        elif offset == "below":
            target = next((j + 1 for j in range(k + 1, len(lines)) if designated[j] is None), 0)
        else:
            target = lineno + int(offset)
        found.append(Expected(m.group(1), target, m.group(5), m.group(2) is not None, lineno))
    return found


def _severity(diag: ir.Diagnostic) -> str:
    return str(diag.severity).rsplit(".", 1)[-1].lower()


def _where(loc: ir.Location) -> tuple[str, int, int] | None:
    m = _FILE_LOC.search(str(loc))  # the first file location inside names, call sites and fusions
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


@dataclass
class DiagnosticVerifier:
    """Collects every diagnostic of the contexts it is attached to, then compares with the comments
    of ``source`` (the input's text; ``names`` are the file names its locations may carry)."""

    source: str
    names: tuple[str, ...]
    seen: list[Seen] = field(default_factory=list)

    def attach(self, context: ir.Context) -> None:
        """Routes ``context``'s diagnostics here: errors too (they are not raised with the exception)."""
        context.emit_error_diagnostics = True
        context.attach_diagnostic_handler(self._handle)

    def _handle(self, diag: ir.Diagnostic) -> bool:
        for d in (diag, *diag.notes):
            self.seen.append(Seen(_severity(d), _where(d.location), d.message))
        return True  # handled: nothing is printed

    def add_unlocated(self, message: str) -> None:
        """An error raised without a diagnostic (it can only match ``@unknown``)."""
        self.seen.append(Seen("error", None, message))

    def verify(self) -> list[str]:
        """The mismatches as ``file:line:col: error: ...`` lines; empty when everything matched."""
        expected = parse_expected(self.source)
        main = self.names[0]
        problems = []
        for d in self.seen:
            in_input = d.where is not None and d.where[0] in self.names
            line = d.where[1] if in_input else None
            if d.where is not None and not in_input:
                problems.append(f"{d.where[0]}:{d.where[1]}:{d.where[2]}: error: unexpected {d.severity} "
                                f"(outside the input): {d.message}")
                continue
            candidates = [e for e in expected if e.line == line and e.matches(d.message)]
            hit = next((e for e in candidates if e.severity == d.severity), None)
            if hit is not None:
                hit.matched = True
            elif candidates:  # a near miss is reported once, as such
                e = candidates[0]
                e.matched = True
                problems.append(f"{main}:{e.comment_line}:1: error: '{d.severity}' diagnostic emitted when "
                                f"expecting a '{e.severity}': {d.message}")
            else:
                at = f"{main}:{d.where[1]}:{d.where[2]}" if d.where else f"{main}: <unknown location>"
                problems.append(f"{at}: error: unexpected {d.severity}: {d.message}")
        for e in expected:
            if not e.matched:
                problems.append(f"{main}:{e.comment_line}:1: error: expected {e.severity} \"{e.text}\" "
                                "was not produced")
        return problems
