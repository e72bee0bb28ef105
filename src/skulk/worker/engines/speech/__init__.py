"""Speech engines: `whisper.WhisperEngine` (speech to text through faster-whisper) and
`piper_voice.PiperEngine` (text to speech through Piper). Each serves one workload of the
table (`skulk.shared.types.workloads`: transcription, speech) and no text generation."""
