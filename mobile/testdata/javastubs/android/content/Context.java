// A compile-time stand-in for Android's android.content.Context, which
// the gobind support class go.Seq names: `make mobile-check` compiles the
// generated Java with a desktop JDK, which has no Android classes. Test
// scaffolding only; the app links the real one.
package android.content;

public abstract class Context {
}
