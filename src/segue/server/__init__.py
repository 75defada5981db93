"""The reference server: a REST API with Server-Sent Events and a web page, over ``Runtime``.

``create_app(runtime, info=...)`` gives the FastAPI application; ``segue serve`` runs it with
uvicorn. Requires the ``server`` extra (``pip install "segue[server]"``: FastAPI and uvicorn).
"""

from segue.server.app import ApiError, create_app
from segue.server.schemas import Info

__all__ = ["ApiError", "Info", "create_app"]
