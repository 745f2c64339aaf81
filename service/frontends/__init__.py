"""The front ends: the gRPC servicer (+ video, session, observe interceptor), the HTTP app, bearer auth, replies
built from results, and the one mapping of typed errors to gRPC/HTTP codes. They call the pipeline; nothing below
calls them."""
