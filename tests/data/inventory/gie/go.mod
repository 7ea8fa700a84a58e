module sigs.k8s.io/gateway-api-inference-extension

go 1.24
