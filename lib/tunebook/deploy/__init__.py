"""Deployments: the files that start a chosen configuration, the checks that it answers, a chat.

serve (serve.yaml / serve.sh / start.sh: start and `--check`), deployment (an N-replica
deployment's files), chat and chat_app (a Chainlit front end over the OpenAI API). Below the
topics: the assembly topic decides what to deploy and asks this room to write it.
"""
