"""ApiError: an HTTP answer raised from anywhere in a request, rendered as {"error", "request_id"}.

python -c "from qserve.serve.infra.errors import ApiError; print(ApiError(404, 'unknown model'))"
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}
