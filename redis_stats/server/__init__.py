"""The HTTP server of the views: routes, negotiation, limits (its views in ``views/``)."""
