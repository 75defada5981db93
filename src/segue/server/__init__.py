"""The reference server: a REST API with Server-Sent Events and a web page, over ``Runtime``.

``create_app(runtime)`` gives the FastAPI application (``info=`` and ``token=`` optional);
``segue serve`` runs it with uvicorn. Requires the ``server`` extra (``pip install
"segue[server]"``: FastAPI and uvicorn).
"""

from segue._lazy import missing_extra

try:
    from segue.server.app import create_app, default_info
    from segue.server.errors import ApiError
    from segue.server.schemas import Info
except ModuleNotFoundError as _missing:  # FastAPI: the server extra
    raise missing_extra("segue.server", _missing) from _missing

__all__ = ["ApiError", "Info", "create_app", "default_info"]
