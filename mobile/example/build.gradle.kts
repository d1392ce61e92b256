// The example app of tandem's Android facade (package mobile). Build the
// bindings first, from the repository root:
//   gomobile bind -target=android/arm64 -androidapi 21 -o mobile/example/app/libs/tandem.aar ./mobile
// then open this folder in Android Studio or run ./gradlew installDebug.
plugins {
    id("com.android.application") version "8.5.2" apply false
    id("org.jetbrains.kotlin.android") version "1.9.24" apply false
}
