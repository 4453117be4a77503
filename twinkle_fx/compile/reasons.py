"""Why a region was kept: :class:`KeepRegion`, raised below a pass, and the reasons it carries.

Passes report a kept region with a :class:`Reason` (a :class:`ReasonKind` and the detail, shared
with the eager path: :mod:`twinkle_fx.core.reasons`); the report and :func:`twinkle_fx.explain` show
``str(reason)``, tools and tests read ``reason.kind``.
"""

from __future__ import annotations

from ..core.reasons import Reason, ReasonKind

__all__ = ["ReasonKind", "Reason", "KeepRegion"]


class KeepRegion(Exception):
    """Raised anywhere below a pass to keep the region being swapped; the pass reports ``reason``."""

    def __init__(self, kind: ReasonKind, detail: str, exception: BaseException | None = None) -> None:
        super().__init__(detail)
        self.reason = Reason(kind, detail, exception)
