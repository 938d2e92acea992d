"""Each emitted token's piece of the decoded text, streamed as the tokens arrive."""

from __future__ import annotations


class TokenText:
    """Each token's piece of the decoded text, O(1) amortized per token.

    Decodes a short window of recent tokens without and with the new one and emits the difference,
    as streaming servers do (the window's own start-of-text effects cancel out). A token whose text is
    not yet complete (half of a multi-byte character) waits and its text arrives with a later token.
    When a tokenizer rewrites text already handed out (cleaned-up spaces), `rewrite` fixes the pieces
    inside the window; `flush` decodes everything once at the end and `resync`s if anything still
    differs, so the pieces always concatenate to `tokenizer.decode(ids, skip_special_tokens=True)`.
    """

    WINDOW = 4  # settled tokens decoded again as context for the next piece

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.pieces = tokenizer, [], []
        self.settled = 0  # tokens whose text has been handed out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add(self, token_id: int) -> dict[int, str]:
        """Appends a token; returns {token index: its text} for every piece that changed."""
        self.ids.append(token_id)
        self.pieces.append("")
        start = max(self.settled - self.WINDOW, 0)
        before, after = self.decode(self.ids[start:self.settled]), self.decode(self.ids[start:])
        if after.endswith("\ufffd"):
            return {}  # an incomplete multi-byte character: its text arrives with a later token
        if not after.startswith(before):
            return self.rewrite(start, before, after)
        self.pieces[-1] = after[len(before):]
        self.settled = len(self.ids)
        return {len(self.ids) - 1: self.pieces[-1]}

    def rewrite(self, start: int, before: str, after: str) -> dict[int, str]:
        """The new token changed text already handed out (e.g. " n't" -> "n't"): rewrites the pieces of the
        window from the first changed character, the rest of the text going to the newest token."""
        emitted = "".join(self.pieces[start:self.settled])
        lead = len(emitted) - len(before)  # text the window's decode drops at its start (a leading space)
        if lead < 0 or emitted[lead:] != before:
            return self.resync()
        common = 0
        while common < min(len(before), len(after)) and before[common] == after[common]:
            common += 1
        pos, k = 0, start
        while pos + len(self.pieces[k]) <= lead + common and k < self.settled:
            pos += len(self.pieces[k])
            k += 1
        changed = {j: "" for j in range(k, len(self.pieces))}
        changed[len(self.pieces) - 1] = (emitted[:lead] + after)[pos:]
        for j, piece in changed.items():
            self.pieces[j] = piece
        self.settled = len(self.ids)
        return changed

    def resync(self) -> dict[int, str]:
        """Decodes everything once and rewrites the pieces from the first one that differs."""
        full = self.decode(self.ids)
        pos, i = 0, 0
        while i < len(self.pieces) and full.startswith(self.pieces[i], pos):
            pos += len(self.pieces[i])
            i += 1
        if i == len(self.pieces) and pos == len(full):
            return {}
        changed = {k: "" for k in range(i, len(self.pieces))}
        changed[len(self.pieces) - 1] = full[pos:]  # the rest of the text goes to the newest token
        for k, piece in changed.items():
            self.pieces[k] = piece
        self.settled = len(self.ids)
        return changed

    def flush(self) -> dict[int, str]:
        """Gives any waiting text to the last token and checks the whole text once."""
        return self.resync() if self.ids else {}
