"""Batch script checks and #SBATCH directive words."""

from __future__ import annotations

import pytest

from scheduler.slurm.batchscript import SbatchError, check_script, directive_lines, wrap_script


def test_wrap_builds_slurms_script() -> None:
    assert wrap_script("sleep 2") == (
        "#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsleep 2\n"
    )


def test_it_rejects_a_script_without_a_shebang() -> None:
    with pytest.raises(SbatchError) as caught:
        check_script("echo hi\n")
    assert caught.value.exit_code == 1
    assert caught.value.lines == [
        "sbatch: error: This does not look like a batch script.  The first",
        "sbatch: error: line must start with #! followed by the path to an interpreter.",
        "sbatch: error: For instance: #!/bin/sh",
    ]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("", "sbatch: error: Batch script is empty!"),
        ("  \n\n", "sbatch: error: Batch script contains only whitespace!"),
        ("#!/bin/sh\r\necho\r\n", "sbatch: error: Batch script contains DOS line breaks (\\r\\n)"),
        ("#!/bin/sh\necho \0\n", "sbatch: error: The Slurm controller does not allow scripts"),
    ],
)
def test_it_rejects_scripts_slurm_rejects(script: str, message: str) -> None:
    with pytest.raises(SbatchError) as caught:
        check_script(script)
    assert caught.value.exit_code == 1
    assert caught.value.lines[0].startswith(message)


def test_dos_line_breaks_get_slurms_two_lines() -> None:
    with pytest.raises(SbatchError) as caught:
        check_script("#!/bin/sh\r\n")
    assert caught.value.lines == [
        "sbatch: error: Batch script contains DOS line breaks (\\r\\n)",
        "sbatch: error: instead of expected UNIX line breaks (\\n).",
    ]


def test_a_good_script_passes() -> None:
    check_script("#!/bin/bash\necho hi\n")


SCRIPT = """\
#!/bin/bash
# a comment

#SBATCH -J "my job" --time=10   # trailing comment
#SBATCH --comment='it is # not a comment'
#SBATCH --output=out\\ file.log
 #SBATCH --indented=ignored
#SBATCHNOT -J nope
##SBATCH -J disabled
#SBATCH

echo start
#SBATCH -J too-late
"""


def test_directives_are_read_until_the_first_command() -> None:
    found = directive_lines(SCRIPT)
    assert found == [
        (4, ["-J", "my job", "--time=10"]),
        (5, ["--comment=it is # not a comment"]),
        (6, ["--output=out file.log"]),
    ]


def test_an_unquoted_hash_ends_the_words_even_inside_one() -> None:
    assert directive_lines("#!/bin/sh\n#SBATCH --comment=a#b -J x\n") == [(2, ["--comment=a"])]


def test_unbalanced_quotes_are_an_error_naming_the_line() -> None:
    with pytest.raises(SbatchError) as caught:
        directive_lines('#!/bin/sh\n#SBATCH -J "open\n')
    assert "line 2" in caught.value.lines[0]
    assert caught.value.exit_code == 255
