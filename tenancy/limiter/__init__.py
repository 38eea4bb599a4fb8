"""Rate, concurrency and budget limiters behind one `Limiter` protocol."""

from tenancy.limiter.base import Admission, Limiter
from tenancy.limiter.factory import make_limiter

__all__ = ["Admission", "Limiter", "make_limiter"]
