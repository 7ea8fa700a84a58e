package flowcontrol

// FeatureGate turns the flow-control layer on.
const FeatureGate = "flowControl"
