"""The rule every command-line tool shares (``dkvstream.storage.cli.run_command``): a usage
mistake exits 2, a ``DkvstreamError`` or ``OSError`` exits 1, each with one line on
stderr; anything else is a bug and keeps its traceback."""
from __future__ import annotations

import pytest

from dkvstream.storage.cli import FAILED, USAGE, UsageError, run_command
from dkvstream.storage.errors import CorruptionError
from dkvstream.storage.log.errors import UnknownTopicError


def _raising(error: BaseException):
    def command():
        raise error
    return command


@pytest.mark.parametrize(("error", "usage_errors", "status", "line"), [
    (UsageError("no store at x: no such directory"), (), USAGE, "error: no store at x: no such directory\n"),
    (ValueError("'zz' is not hex"), (ValueError,), USAGE, "error: 'zz' is not hex\n"),
    (UnknownTopicError("no topic 't'"), (UnknownTopicError,), USAGE, "error: no topic 't'\n"),
    (CorruptionError("file:///s/a.sst offset 12:\n  bad checksum"), (), FAILED,
     "error: CorruptionError: file:///s/a.sst offset 12: bad checksum\n"),
    (FileNotFoundError("/s: no such directory"), (), FAILED, "error: /s: no such directory\n"),
])
def test_an_error_is_one_line_and_an_exit_status(capsys, error, usage_errors, status, line) -> None:
    assert run_command(_raising(error), usage_errors) == status
    assert capsys.readouterr().err == line


def test_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(ZeroDivisionError):
        run_command(_raising(ZeroDivisionError("division by zero")))
    # A ValueError is a usage mistake only where a tool says so.
    with pytest.raises(ValueError):
        run_command(_raising(ValueError("x")), ())
