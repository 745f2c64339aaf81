"""The HTTP front end: health, metrics, info and /v1/encode (+ video) on FastAPI, its gate and replies."""
