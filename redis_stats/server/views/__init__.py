"""The views the server routes to: each a function of (a read of the store, the parsed query)."""
