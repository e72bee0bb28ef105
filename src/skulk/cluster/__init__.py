"""Async shells for the cluster services every node runs (election, state replica, event
producer, telemetry, membership). They move data between the router and the pure cores in
`skulk.shared` and hold no policy of their own."""
