"""Web surfaces: health, Teams endpoint, HTTP API, WebSocket, web chat."""
