"""Request parsers (`openai-parser`, `anthropic-parser`, `vllmhttp-parser`, `sglanghttp-parser`,
`vertexai-parser`, `vllmgrpc-parser`, `passthrough-parser`): each claims the paths of one API and
reads its bodies and usage."""
