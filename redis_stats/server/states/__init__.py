"""What the views share: the states the server keeps of a namespace or of itself, made at first use.

A view (:mod:`redis_stats.server.views`) asks its source for a state (``source.state(feed_of)``,
``source.kept("window", ...)``) or the app for one of the whole server (``app.state(ScrapeStats)``);
the state reads, refreshes and keeps, and closes with its source. No state imports a view.
"""
