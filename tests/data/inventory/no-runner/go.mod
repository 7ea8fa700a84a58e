module github.com/llm-d/llm-d-router

go 1.24
