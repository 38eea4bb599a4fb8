"""Ids unique across processes without a syscall per id (request ids, limiter leases).

`uuid.uuid4()` and `secrets` read os.urandom, which releases the GIL; on an event
loop that shares the GIL with the engine thread each release can cost a wait of up
to the switch interval. So the randomness is drawn once per instance: a 256-bit key,
and each id is a keyed BLAKE2b of a private counter, cut to 96 bits. The ids are
unique within an instance unless two 96-bit outputs of a PRF collide (about 2**-33
after 2**32 ids, across every gateway together), and they are unlinkable (issue 46):
one id, or any number of them, tells nothing about how many were drawn in between,
so a tenant cannot count other tenants' traffic from its own `chatcmpl-`, `resp_` or
`x-cloister-request-id` values, nor learn the next id without the key.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets

ID_BYTES = 12  # 96 bits: 24 hex characters


class UniqueIds:
    """Hands out 24-hex ids, pseudorandom under a key drawn per instance."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._counter = itertools.count(1)

    def next(self, kind: str | None = None) -> str:
        """A fresh id such as `5f2c9a01b7e4d1836a0c9e42`, or `chatcmpl-5f2c...` with a kind."""
        block = next(self._counter).to_bytes(16, "big")
        value = hashlib.blake2b(block, key=self._key, digest_size=ID_BYTES).hexdigest()
        return value if kind is None else f"{kind}-{value}"
