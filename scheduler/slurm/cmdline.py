"""GNU `getopt_long`, as the Slurm commands use it.

argparse cannot reproduce it: Slurm accepts any unambiguous prefix of a long option,
optional arguments only after `=`, glued short arguments (`-Jname`, `-N2`), clustered
flags, and either stops at the first operand (sbatch, whose later words belong to the
script) or lets options and operands mix (squeue, scancel). The error messages are
glibc's, because scripts and people match on them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Sequence


class Arg:
    """Whether an option takes an argument. Plain constants, not an Enum: `enum` costs
    a quarter of the interpreter's start, and every command parses its line."""

    NONE = 0
    REQUIRED = 1
    OPTIONAL = 2


# Plain classes rather than dataclasses: every command builds its table at start-up, and
# `dataclasses` (with `inspect`) would cost a third of the interpreter's own start.
class Option:
    """One entry of an option table. `key` names the option for the caller."""

    __slots__ = ("arg", "key", "long", "short")

    def __init__(self, long: str, short: str = "", arg: int = Arg.NONE, key: str = "") -> None:
        self.long, self.short, self.arg, self.key = long, short, arg, key

    @property
    def name(self) -> str:
        return self.key or self.long

    def __repr__(self) -> str:
        return f"Option({self.long!r}, {self.short!r}, {self.arg}, {self.key!r})"


class GetoptError(ValueError):
    """A malformed command line; `str()` is glibc's message without the program name."""


class Parsed:
    __slots__ = ("operands", "options")

    def __init__(self, options: list[tuple[Option, str | None]], operands: list[str]) -> None:
        self.options, self.operands = options, operands


class OptionTable:
    def __init__(self, options: Sequence[Option]) -> None:
        self.options = tuple(options)
        self._long = {o.long: o for o in self.options if o.long}
        self._short = {o.short: o for o in self.options if o.short}

    def by_name(self, name: str) -> Option:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)

    def find_long(self, name: str) -> Option:
        """The option `--name` means: an exact name, else the one it is a prefix of."""
        exact = self._long.get(name)
        if exact is not None:
            return exact
        matches = [o for long, o in self._long.items() if long.startswith(name)]
        distinct = {o.name for o in matches}
        if not matches:
            raise GetoptError(f"unrecognized option '--{name}'")
        if len(distinct) > 1:
            listed = " ".join(f"'--{o.long}'" for o in matches)
            raise GetoptError(f"option '--{name}' is ambiguous; possibilities: {listed}")
        return matches[0]

    def parse(self, argv: Sequence[str], *, stop_at_operand: bool) -> Parsed:
        """Split argv into (option, value) pairs in order and the operands.

        With `stop_at_operand`, the first operand and everything after it are
        operands (getopt's `+` mode, which sbatch uses so the script keeps its args).
        """
        options: list[tuple[Option, str | None]] = []
        operands: list[str] = []
        i = 0
        args = list(argv)
        while i < len(args):
            word = args[i]
            i += 1
            if word == "--":
                operands.extend(args[i:])
                break
            if word.startswith("--"):
                body = word[2:]
                name, eq, value = body.partition("=")
                option = self.find_long(name)
                shown = f"--{option.long}"
                if eq:
                    if option.arg == Arg.NONE:
                        raise GetoptError(f"option '{shown}' doesn't allow an argument")
                    options.append((option, value))
                elif option.arg == Arg.REQUIRED:
                    if i >= len(args):
                        raise GetoptError(f"option '{shown}' requires an argument")
                    options.append((option, args[i]))
                    i += 1
                else:
                    options.append((option, None))
                continue
            if word.startswith("-") and word != "-":
                pos = 1
                while pos < len(word):
                    letter = word[pos]
                    pos += 1
                    short = self._short.get(letter)
                    if short is None:
                        raise GetoptError(f"invalid option -- '{letter}'")
                    if short.arg == Arg.NONE:
                        options.append((short, None))
                        continue
                    rest = word[pos:]
                    if rest:
                        options.append((short, rest))
                    elif short.arg == Arg.OPTIONAL:
                        options.append((short, None))
                    else:
                        if i >= len(args):
                            raise GetoptError(f"option requires an argument -- '{letter}'")
                        options.append((short, args[i]))
                        i += 1
                    break
                continue
            if stop_at_operand:
                operands.append(word)
                operands.extend(args[i:])
                break
            operands.append(word)
        return Parsed(options=options, operands=operands)
