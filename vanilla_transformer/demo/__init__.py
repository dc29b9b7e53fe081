"""The web demo: `app.build_app(model_dir)` is a Gradio app that translates a sentence and shows the attention behind
the translation (the `demo` extra: gradio and matplotlib)."""
