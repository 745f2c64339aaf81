"""`mmproc serve` on uvloop (A/B of the event loop under overload; scripts/gpu_overload_check.sh SERVER_MAIN=...)."""

import sys

if __name__ == "__main__":
    import asyncio

    import uvloop

    from service.process import cli

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # asyncio.run then makes a uvloop loop
    sys.exit(cli.main())
