"""Sends one image message through LangChain's `ChatOpenAI`, the way its users attach an
image (a `HumanMessage` whose content holds a text block and an `image_url` block with a
data URI), invoked and streamed, and prints the answers as one JSON object.

    .venv-clients/bin/python e2e/clients/vision.py http://127.0.0.1:8080/v1 MODEL MAX_TOKENS < message.json

message.json: `{"text": "...", "image": "data:image/png;base64,..."}`.
"""

import json
import sys

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI


def main(base, model, max_tokens):
    message = json.load(sys.stdin)
    chat = ChatOpenAI(base_url=base, api_key="unused", model=model, temperature=0,
                      max_tokens=max_tokens, max_retries=0)
    human = HumanMessage(content=[
        {"type": "text", "text": message["text"]},
        {"type": "image_url", "image_url": {"url": message["image"]}},
    ])
    answer = chat.invoke([human])
    out = {
        "invoke": answer.content,
        "stream": [c.content for c in chat.stream([human])],
        "usage": answer.usage_metadata,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
