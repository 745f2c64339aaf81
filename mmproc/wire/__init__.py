"""The protobuf wire codec the server and the client share: dtypes, reply framing, reply codecs, the transports."""
