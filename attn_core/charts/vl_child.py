"""The process that runs vl-convert for charts.export: a panic in vl-convert aborts its process, so it is this one,
never the caller (the Streamlit server). Run by path (`python -P vl_child.py`): it imports neither attn_core nor torch,
so it starts in a fraction of a second.

A request on stdin: 8 bytes of length (big-endian), then that much JSON {"to": "png" | "svg" | "html", "spec": {...},
"options": {...}, "fonts": [folders]}. The answer on stdout: b"+" or b"-", 8 bytes of length, then the bytes made or
the error's text (UTF-8). The loop ends when stdin does."""
import json
import os
import sys

import vl_convert as vlc

HEADER = 8  # bytes of a length


def read_exactly(stream, size: int) -> bytes | None:
    """`size` bytes from `stream`, or None where it ends first."""
    data = b""
    while len(data) < size:
        part = stream.read(size - len(data))
        if not part:
            return None
        data += part
    return data


def answer(ok: bool, data: bytes) -> None:
    sys.stdout.buffer.write((b"+" if ok else b"-") + len(data).to_bytes(HEADER, "big") + data)
    sys.stdout.buffer.flush()


def convert(request: dict) -> bytes:
    spec, options = request["spec"], request.get("options", {})
    if request["to"] == "png":
        return vlc.vegalite_to_png(spec, **options)
    if request["to"] == "svg":
        return vlc.vegalite_to_svg(spec, **options).encode("utf-8")
    if request["to"] == "html":
        return vlc.vegalite_to_html(spec, **options).encode("utf-8")
    raise ValueError(f"no conversion to {str(request['to'])[:20]!r}")


def main() -> None:
    registered = set()
    while (head := read_exactly(sys.stdin.buffer, HEADER)) is not None:
        body = read_exactly(sys.stdin.buffer, int.from_bytes(head, "big"))
        if body is None:
            return
        try:
            request = json.loads(body)
            for folder in request.get("fonts", ()):
                if folder not in registered and os.path.isdir(folder):
                    vlc.register_font_directory(folder)
                    registered.add(folder)
            answer(True, convert(request))
        except Exception as e:  # vl-convert's own errors (ValueError mostly): said to the caller, the loop goes on
            answer(False, f"{type(e).__name__}: {e}"[:500].encode("utf-8", "replace"))


if __name__ == "__main__":
    main()
