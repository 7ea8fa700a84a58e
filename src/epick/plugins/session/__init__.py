"""Sessions: the producer that reads a request's session id, and the filter that pins a session to an
endpoint."""
