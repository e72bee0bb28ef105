// The microphone's audio thread: hands each 128-sample block of the first channel to the
// page (voice.js), which resamples it to 24 kHz PCM16 for WS /v1/realtime.
class SkulkCapture extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}
registerProcessor("skulk-capture", SkulkCapture);
