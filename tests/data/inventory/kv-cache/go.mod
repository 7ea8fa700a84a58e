module github.com/llm-d/llm-d-kv-cache

go 1.24
