"""Cluster transport: zenoh peer session, sealed envelopes, topic table and planes, presence.

Import the pieces from their modules (`skulk.routing.router.Router`,
`skulk.routing.topics.Topic`, ...). Nothing outside this package touches zenoh directly.
"""
