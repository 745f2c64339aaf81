"""SGLang 0.5.23's encoder protocol (EPD): app.py (routes), header.py (frame 0), push.py (ZMQ), media.py (mm_items)."""
