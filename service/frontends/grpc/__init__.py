"""The gRPC front end: the Encoder servicer (+ video, session, the observing interceptor) and the hop between
its loop and the pipeline's."""
