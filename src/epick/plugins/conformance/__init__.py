"""The plugins GIE's conformance tests configure (`conformance/resources/base.yaml`), so that its
conformance profile can run against epick."""
