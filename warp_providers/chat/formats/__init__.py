"""One module per chat-format family; `ls` this directory to see what is supported.

Modules are imported lazily through `warp_providers.chat.registry`.
"""
