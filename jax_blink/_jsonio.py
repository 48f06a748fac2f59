"""Reading the JSON documents jax_blink writes (topologies, plans, schedules, plan cache entries).

Each document is an object with a ``"format"`` name and a ``"version"``;
:func:`read_document` accepts it as a dict, JSON text or a file path and
reports every problem with the caller's own error type. :func:`read_text_file`
reads a file without ever blocking (a FIFO or device at the path is refused,
not opened for a blocking read) and :func:`parse_json` turns text into
objects; both name what went wrong in the same way. Pure Python.
"""

import json
import os
import stat

__all__ = ["read_document", "read_text_file", "parse_json", "MAX_DOCUMENT_BYTES"]

#: The largest file :func:`read_text_file` reads (64 MiB): far above any
#: topology, plan or schedule jax_blink writes, far below what would exhaust
#: memory.
MAX_DOCUMENT_BYTES = 64 << 20

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def read_text_file(path, *, error: type, what: str, max_bytes: int = MAX_DOCUMENT_BYTES,
                   missing_ok: bool = False):
    """The UTF-8 text of the regular file at ``path``.

    The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before
    anything is read, so a FIFO, socket, device or directory at ``path`` is
    refused at once instead of blocking or reading without end.

    Parameters
    ----------
    path : str or os.PathLike
    error : type
        The exception raised for every problem.
    what : str
        What the file holds, for messages (``"topology"``, ``"plan"``, ...).
    max_bytes : int
        Larger files are refused.
    missing_ok : bool
        Return None instead of raising when no file is at ``path``.

    Raises
    ------
    error
        If the file cannot be opened, is not a regular file, is larger than
        ``max_bytes`` or is not UTF-8 text.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if missing_ok:
            return None
        raise error(f"cannot read {what} file {os.fspath(path)!r}: no such file") from None
    except OSError as e:
        raise error(f"cannot read {what} file {os.fspath(path)!r}: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"cannot read {what} file {os.fspath(path)!r}: not a regular file "
                        f"(a FIFO, socket, device or directory)")
        if info.st_size > max_bytes:
            raise error(f"cannot read {what} file {os.fspath(path)!r}: {info.st_size} bytes, "
                        f"more than the {max_bytes} a {what} file may have")
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"cannot read {what} file {os.fspath(path)!r}: {e.strerror}") from None
    finally:
        if fd is not None:
            os.close(fd)
    if len(data) > max_bytes:
        raise error(f"cannot read {what} file {os.fspath(path)!r}: more than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} file {os.fspath(path)!r} is not UTF-8 text (byte {e.start}); "
                    f"expected {what} JSON") from None


def parse_json(text, *, error: type, what: str):
    """``json.loads(text)``, every failure reported as ``error`` naming ``what``.

    Raises
    ------
    error
        If ``text`` is not UTF-8, not JSON, nested too deeply for the parser,
        or holds a number Python refuses to convert.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"malformed {what} JSON: not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"malformed {what} JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or an integer with too many digits
        raise error(f"malformed {what} JSON: {e}") from None


def _json_kind(value) -> str:
    for kind, name in ((list, "an array"), (str, "a string"), (bool, "a boolean"), (int, "a number"),
                       (float, "a number"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def read_document(source, *, fmt: str, version: int, error: type, what: str) -> dict:
    """Parse ``source`` and check its format header.

    Parameters
    ----------
    source : dict, list, str, bytes or os.PathLike
        The parsed document (a dict; a list is refused as no document), its
        JSON text (a string that starts with ``{`` or ``[``, or bytes), or
        the path of a file holding it.
    fmt : str
        The ``"format"`` the document must name.
    version : int or tuple of int
        The ``"version"`` it must have (one of them).
    error : type
        The exception raised for every problem.
    what : str
        What the document is, for messages.

    Raises
    ------
    error
        If ``source`` is of another type, the file cannot be read
        (:func:`read_text_file`), the text is not JSON (:func:`parse_json`),
        or the value is not an object naming ``fmt`` and ``version``.
    """
    if isinstance(source, (dict, list)):  # already parsed
        data = source
    elif isinstance(source, (bytes, bytearray)):
        data = parse_json(source, error=error, what=what)
    elif isinstance(source, (str, os.PathLike)):
        text = source if isinstance(source, str) else None
        if text is None or not text.lstrip().startswith(("{", "[")):
            text = read_text_file(source, error=error, what=what)
        data = parse_json(text, error=error, what=what)
    else:
        raise error(f"cannot read a {what} from {type(source).__name__} {source!r:.60}; expected a dict, "
                    f"JSON text or a file path")
    if not isinstance(data, dict):
        raise error(f"not a jax_blink {what}: expected a JSON object with \"format\": \"{fmt}\", "
                    f"got {_json_kind(data)}")
    if data.get("format") != fmt:
        raise error(f"not a jax_blink {what}: expected an object with \"format\": \"{fmt}\", "
                    f"got \"format\": {data.get('format')!r:.60}")
    found = data.get("version")
    versions = tuple(version) if isinstance(version, (tuple, list)) else (version,)
    if isinstance(found, bool) or found not in versions:
        wanted = " or ".join(map(str, versions))
        raise error(f"{what} format version {found!r:.60}; this jax_blink reads {wanted}")
    return data
