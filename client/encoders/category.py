"""Categories: one-hot bit for the category, then RAPPOR's PRR and IRR."""

from __future__ import annotations

from typing import Any

from veil.client.encoders.base import Encoder
from veil.client.encoders.rappor import BitRappor
from veil.shared.bits import bits_to_hex
from veil.shared.kinds import CategoryParams


class CategoryEncoder(Encoder[CategoryParams]):
    """Basic RAPPOR. The PRR stream has purpose ``prr`` and context
    ``fingerprint || 0x00 || utf8(category)``."""

    params_type = CategoryParams
    name_keyed_in_layout_1 = True

    def __init__(self, params: CategoryParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.rappor = BitRappor(params.k, params.p, params.q, params.f)

    def memo_key(self, value: Any) -> bytes:
        return self.params.categories[self.params.index(value)].encode()

    def derive(self, key: bytes) -> int:
        bits = 1 << self.params.index(key.decode())
        return self.rappor.prr(bits, self.permanent_stream(b"prr", key))

    def finish(self, permanent: int) -> str:
        return bits_to_hex(self.rappor.irr(permanent, self.fresh), self.params.k)
