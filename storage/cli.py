"""What the command-line tools share: exit statuses, one-line errors, bytes on a command line.

The tools (``storage.dkv.dump``, ``storage.log.dump``, ``storage.log.console``,
``operators.tools.state_reader``) exit with:

* 0: done;
* 1: a stored file is damaged or missing (``StorageError``, ``OSError``; the message
  names the file and offset), or a ``verify`` found damage;
* 2: a usage mistake (argparse's own status for a bad option, too).

An error is one line on standard error, ``error: <message>``, never a traceback.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

from storage.errors import StorageError

USAGE = 2
DAMAGE = 1


def run_command(command: Callable[[], int | None],
                usage_errors: tuple[type[BaseException], ...] = (ValueError,)) -> int:
    """Runs a tool's command and maps what it raises to an exit status (module docstring).

    Args:
        command: the command; returns its exit status (None: 0).
        usage_errors: what a usage mistake raises (exit 2). Checked before
            ``StorageError``/``OSError``, so a subclass of those can be a usage error.

    Returns:
        The exit status.
    """
    try:
        return command() or 0
    except usage_errors as e:
        # A KeyError's str() is the repr of its message: print the message itself.
        print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return USAGE
    except (StorageError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return DAMAGE


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
