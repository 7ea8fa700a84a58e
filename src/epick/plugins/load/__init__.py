"""In-flight load: the producer that counts what this EPP sent, and the plugins that read it."""
