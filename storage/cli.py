"""What the command-line tools share: exit statuses, one-line errors, bytes on a command line.

Every ``python -m`` tool (``dkvstream.operators.tools.run_job``, ``dkvstream.operators.tools.state_reader``,
``dkvstream.storage.dkv.dump``, ``dkvstream.storage.log.dump``, ``dkvstream.storage.log.console``) runs its command
through ``run_command`` and exits with:

* 0: done;
* 1: the command line was right but something else failed: a ``DkvstreamError`` (a
  stored file damaged or missing, an epoch that failed, no Java, S3 credentials missing
  or refused; the message says which and what to do) or an ``OSError``; or a
  ``verify`` found damage;
* 2: a usage mistake, something to change on the command line (``UsageError``, and
  what each tool names besides: an unknown epoch, state id or ``--store``; argparse's
  own status for a bad option, too).

Either error is one line on standard error, ``error: <message>`` (``error: <Type>:
<message>`` for a ``DkvstreamError``, whose type the docs' error tables list), never a
traceback. Any other exception is a bug: it is not caught, so its traceback is printed.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

from dkvstream.storage.errors import DkvstreamError

USAGE = 2
FAILED = 1


class UsageError(DkvstreamError, ValueError):
    """Raised when a tool is given something that cannot work; the message says what to
    change on the command line (exit status 2)."""


def run_command(command: Callable[[], int | None],
                usage_errors: tuple[type[BaseException], ...] = (ValueError,)) -> int:
    """Runs a tool's command and maps what it raises to an exit status (module docstring).

    Args:
        command: the command; returns its exit status (None: 0).
        usage_errors: what else a usage mistake raises (exit 2), besides ``UsageError``.
            Checked before ``DkvstreamError``/``OSError``, so a subclass of those can be
            a usage error.

    Returns:
        The exit status.
    """
    try:
        return command() or 0
    except (UsageError, *usage_errors) as e:
        print(f"error: {_message(e)}", file=sys.stderr)
        return USAGE
    except DkvstreamError as e:
        print(f"error: {type(e).__name__}: {_message(e)}", file=sys.stderr)
        return FAILED
    except OSError as e:
        print(f"error: {_message(e)}", file=sys.stderr)
        return FAILED


def _message(e: BaseException) -> str:
    """``e``'s message on one line (a KeyError's str() is the repr of its message: the
    message itself)."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return " ".join(text.split())


def render_bytes(data: bytes | None, hex: bool = False) -> str | None:
    """Bytes for a JSON line of a tool: hex digits with ``hex``, else UTF-8 text with
    undecodable bytes escaped as ``\\xNN`` (for reading, not round trips; use ``hex`` for
    exact bytes). None stays None."""
    if data is None:
        return None
    return data.hex() if hex else data.decode("utf-8", "backslashreplace")


def parse_bytes(text: str, hex: bool = False) -> bytes:
    """A key given on the command line: hex digits with ``hex``, else UTF-8 text.

    Raises:
        ValueError: ``hex`` and ``text`` is not hex (the message names it).
    """
    if not hex:
        return text.encode("utf-8")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{text!r} is not hex (--hex takes keys as hex digits)") from None
