"""Small text helpers shared by the runtime tests."""


def clean_substring(text: str, start: int, size: int = 2) -> str:
    """A substring of printable characters (random tiny models also emit broken UTF-8)."""
    for i in range(start, len(text) - size):
        piece = text[i : i + size]
        if piece.isprintable() and "\ufffd" not in piece:
            return piece
    raise AssertionError(f"no clean substring in {text!r}")
