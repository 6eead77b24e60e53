//! Host-side bindings of the `wasmop:plugin@0.2.0` world, generated from the same WIT file the
//! guest SDK uses (`guest-sdk/wit`), so the two sides cannot drift apart silently.

wasmtime::component::bindgen!({
    path: "../guest-sdk/wit",
    world: "plugin",
});
