"""Batch scripts: the checks sbatch makes before submitting, `--wrap`, and the words of
the `#SBATCH` directives.

The messages are Slurm 22.05's (`sbatch.c: _get_script_buffer`), word for word.
"""

from __future__ import annotations


class SbatchError(Exception):
    """sbatch must stop: `lines` go to stderr (prefix included), then exit `exit_code`."""

    def __init__(self, lines: list[str], exit_code: int) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines
        self.exit_code = exit_code


def error(message: str, exit_code: int) -> SbatchError:
    return SbatchError([f"sbatch: error: {message}"], exit_code)


def wrap_script(command: str) -> str:
    """The script Slurm builds for `--wrap=CMD`."""
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"


def check_script(text: str) -> None:
    """Refuse what Slurm's sbatch refuses, with its messages (all exit 1)."""
    if not text:
        raise error("Batch script is empty!", 1)
    if not text.strip():
        raise error("Batch script contains only whitespace!", 1)
    if not text.startswith("#!"):
        raise SbatchError(
            [
                "sbatch: error: This does not look like a batch script.  The first",
                "sbatch: error: line must start with #! followed by the path to an interpreter.",
                "sbatch: error: For instance: #!/bin/sh",
            ],
            1,
        )
    if "\0" in text:
        raise error(
            "The Slurm controller does not allow scripts that contain a NULL character '\\0'.",
            1,
        )
    if "\r\n" in text:
        raise SbatchError(
            [
                "sbatch: error: Batch script contains DOS line breaks (\\r\\n)",
                "sbatch: error: instead of expected UNIX line breaks (\\n).",
            ],
            1,
        )


def directive_lines(text: str, magic: str = "#SBATCH") -> list[tuple[int, list[str]]]:
    """The words of each `#SBATCH` line, with its line number.

    Like Slurm, directives must start at column 0 and are read until the first line
    that is neither blank nor a comment; quotes and backslashes group words, and an
    unquoted `#` starts a comment for the rest of the line.
    """
    found: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if lineno == 1 and line.startswith("#!"):
            continue
        if not line.strip():
            continue
        if not line.startswith("#"):
            break
        if not line.startswith(magic):
            continue
        rest = line[len(magic) :]
        if rest and not rest[0].isspace():
            # `#SBATCHX` is just a comment to Slurm.
            continue
        import shlex  # only a script with directives has words to split

        lexer = shlex.shlex(rest, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError as exc:
            raise error(f"Invalid #SBATCH directive on line {lineno}: {exc}", 255) from exc
        if words:
            found.append((lineno, words))
    return found
