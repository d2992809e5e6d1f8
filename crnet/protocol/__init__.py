"""The wire and what travels on it: frames, fields, every message, the connection (a
BufferedProtocol), authentication, TLS and the shared memory a training process lends. Never
imports a scheme or the node."""
