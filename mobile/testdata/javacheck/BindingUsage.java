// BindingUsage calls the generated Java API of package mobile the way the
// example app (mobile/example, Kotlin) does, so that `make mobile-check`
// fails when a name or signature it relies on changes. It is compiled,
// never run (running needs the native library gomobile bind builds).
import mobile.Engine;
import mobile.Mobile;
import mobile.TokenCallback;

final class BindingUsage {
	static String run(String modelPath) throws Exception {
		Engine engine = Mobile.newEngine("{\"model\": \"" + modelPath + "\", \"budget\": \"auto\"}");
		try {
			final StringBuilder shown = new StringBuilder();
			String result = engine.generate("{\"prompt\": \"Once upon a time\", \"max_tokens\": 64, \"id\": \"story\"}",
				new TokenCallback() {
					@Override public void onToken(String text) { shown.append(text); }
					@Override public void onSegment(String text) { shown.append('\n'); }
				});
			boolean found = engine.cancel("story");
			String next = engine.resume("story", "{\"deadline_ms\": 500}", null);
			return result + next + found + engine.stats();
		} finally {
			engine.close();
		}
	}
}
