"""Admission: accepted connections until through their handshake (the doorway's caps and
deadline, the authentication guard, TLS once admitted)."""
