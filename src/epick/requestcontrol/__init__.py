"""Request control: parse, admit, schedule, run the request-control hooks. No HTTP server here."""
