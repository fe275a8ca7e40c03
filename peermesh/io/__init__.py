"""The one place that touches ZeroMQ and UDP sockets on the gevent hub."""
