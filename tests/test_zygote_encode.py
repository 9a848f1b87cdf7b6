"""The zygote's hand-made JSON (hcp_linux.zygote.encode: it does not import json) parses
back with json to what json.dumps would give, for any string, including astral characters, lone
surrogates (names decoded with surrogateescape), quotes, backslashes and control bytes."""
from __future__ import annotations

import json
import random

from hcp_linux.zygote import encode

SPECIAL = ['"', "\\", "\n", "\x00", "\x7f", "\u2028", "\udcff", "\U0001f600", "é", "/"]


def _random_text(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(0, 40)):
        pick = rng.random()
        if pick < 0.3:
            out.append(rng.choice(SPECIAL))
        elif pick < 0.6:
            out.append(chr(rng.randrange(0x20, 0x7F)))
        else:
            n = rng.randrange(0, 0x110000)
            out.append(chr(n))
    return "".join(out)


def test_encode_round_trips_through_json() -> None:
    rng = random.Random(20261203)
    for _ in range(5000):
        obj = {"id": rng.randrange(-2**40, 2**40), "fatal": _random_text(rng),
               _random_text(rng) or "k": _random_text(rng)}
        # what json itself makes of it (two lone surrogates side by side read back as one
        # astral character there too: JSON escapes are UTF-16)
        assert json.loads(encode(obj)) == json.loads(json.dumps(obj)), obj
        if not any(0xD800 <= ord(c) <= 0xDFFF for v in (*obj, *obj.values()) if isinstance(v, str)
                   for c in v):
            assert json.loads(encode(obj)) == obj, obj


def test_every_message_shape() -> None:
    for obj in ({"ready": 1}, {"id": 3, "pid": 42}, {"id": 3, "error": 22},
                {"id": 3, "status": -9, "leftovers": "killed"}, {"fatal": "no \"landlock\""}):
        assert json.loads(encode(obj)) == obj
