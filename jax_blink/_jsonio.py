"""Reading the JSON documents jax_blink writes (topologies, plans, schedules).

Each document is an object with a ``"format"`` name and a ``"version"``;
:func:`read_document` accepts it as a dict, JSON text or a file path and
reports every problem with the caller's own error type. Pure Python.
"""

import json


def read_document(source, *, fmt: str, version: int, error: type, what: str) -> dict:
    """Parse ``source`` (dict, JSON text or path) and check its format header.

    Raises
    ------
    error
        If the file cannot be read, the text is not JSON, or the object is
        not a ``fmt`` document of ``version``.
    """
    if isinstance(source, dict):
        data = source
    else:
        text = str(source)
        if not text.lstrip().startswith("{"):
            try:
                with open(text) as f:
                    text = f.read()
            except OSError as e:
                raise error(f"cannot read {what} file {source!r}: {e.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise error(f"malformed {what} JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise error(f"not a jax_blink {what}: expected an object with \"format\": \"{fmt}\"")
    if data.get("version") != version:
        raise error(f"{what} format version {data.get('version')!r}; this jax_blink reads {version}")
    return data
