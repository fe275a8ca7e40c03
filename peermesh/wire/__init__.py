"""Sans-io codecs: bytes in, messages out. Nothing here does I/O."""
