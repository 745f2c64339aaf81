"""Decoding and preprocessing off the event loop: isolated worker processes (images and video) or the GPU JPEG
decoder, and the step that hands them a request's images."""
