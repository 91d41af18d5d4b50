from decaton_aio.cli import entrypoint

entrypoint()
